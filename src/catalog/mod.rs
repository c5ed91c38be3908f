//! The fleet's tools (docs/src/catalog.md): what each backend exposes, learned by asking it as an
//! MCP client would and from the `tools/list` answers the router forwards; which definitions
//! differ between backends; the lock of approved definitions; the prompts and resources each
//! backend lists; and what routing reads of it all.

mod approve;
mod arguments;
mod ask;
mod definition;
mod fleet;
mod keeper;
mod routes;
mod served;

mod filter;

pub use approve::lock_of;
pub use ask::{lists, AskFailed, Limits, Lists};
pub use filter::drop_unscoped;
pub use fleet::BackendTools;
pub use keeper::{Catalog, CatalogMetrics, ClientList};
pub use routes::{shown, ToolRoutes, WhenAllOut};
