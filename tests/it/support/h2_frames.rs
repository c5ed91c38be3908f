//! HTTP/2 as a raw client writes it: frames built by hand (RFC 9113 §4.1) with header blocks
//! of literal fields, for the tests that must send what no HTTP/2 library would (a thousand
//! streams at once, a request head h2 itself must refuse), and a reader of what the server
//! answers, by stream.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTP/2 frame: 9-byte header, then `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING_FRAME: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const WINDOW_UPDATE: u8 = 8;
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const REFUSED_STREAM: u32 = 0x7;

/// An HPACK header block of literal fields, never indexed, no Huffman (RFC 7541 §6.2.3).
pub fn hpack(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in headers {
        assert!(name.len() < 127 && value.len() < 127);
        block.push(0x10);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// What an HTTP/2 server sent a raw client, by stream.
#[derive(Default)]
pub struct Seen {
    /// Streams whose answer ended (a frame with END_STREAM).
    pub answered: std::collections::BTreeSet<u32>,
    /// Streams reset, with the error code.
    pub reset: std::collections::BTreeMap<u32, u32>,
    /// A GOAWAY's error code and debug data.
    pub goaway: Option<(u32, String)>,
}

/// Reads frames off `read` into `seen` until the connection ends; acknowledges PINGs and
/// gives back the window of every DATA frame through `write`.
pub async fn read_frames(
    mut read: tokio::net::tcp::OwnedReadHalf,
    write: Arc<tokio::sync::Mutex<tokio::net::tcp::OwnedWriteHalf>>,
    seen: Arc<parking_lot::Mutex<Seen>>,
) {
    loop {
        let mut head = [0u8; 9];
        if read.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        if read.read_exact(&mut payload).await.is_err() {
            return;
        }
        let mut reply = Vec::new();
        match kind {
            DATA | HEADERS if flags & END_STREAM != 0 => {
                seen.lock().answered.insert(stream);
            }
            RST_STREAM => {
                let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                seen.lock().reset.insert(stream, code);
            }
            PING_FRAME if flags & ACK == 0 => reply = frame(PING_FRAME, ACK, 0, &payload),
            GOAWAY => {
                let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                let debug = String::from_utf8_lossy(&payload[8..]).into_owned();
                seen.lock().goaway = Some((code, debug));
            }
            _ => {}
        }
        if kind == DATA && len > 0 {
            let inc = (len as u32).to_be_bytes();
            reply.extend(frame(WINDOW_UPDATE, 0, 0, &inc));
            reply.extend(frame(WINDOW_UPDATE, 0, stream, &inc));
        }
        if !reply.is_empty() && write.lock().await.write_all(&reply).await.is_err() {
            return;
        }
    }
}
