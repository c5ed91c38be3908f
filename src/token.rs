//! Sealed routing tokens (DESIGN §5). Work in progress.
