//! A response's resource entries, encoded once and gathered into few shared chunks.
//!
//! A view's resources are encoded once each ([`Resource::delta_entry`],
//! [`Resource::sotw_entry`]) and gathered once per output or shared diff ([`Gathered`]);
//! the streams ([`crate::xds::wire`]) write a small per-stream head followed by these
//! chunks, so pushing one output to N streams copies nothing per stream but the head.

use crate::generate::Resource;
use bytes::{Bytes, BytesMut};
use std::sync::{Arc, OnceLock};

/// Entries smaller than this are gathered into one chunk with their neighbours; larger
/// ones are sent as the shared bytes they are.
const GATHER_BELOW: usize = 4096;

/// Gathered chunks grow up to about this size.
const CHUNK: usize = 64 << 10;

/// Resource entries of a response body, gathered into few shared chunks.
#[derive(Debug, Default)]
pub struct Chunks {
    /// The chunks, in order.
    pub chunks: Vec<Bytes>,
    /// Their total length.
    pub len: usize,
}

impl Chunks {
    /// Chunks one after the other (shared, not copied).
    pub fn concat<'a>(parts: impl Iterator<Item = &'a Chunks>) -> Chunks {
        let mut out = Chunks::default();
        for part in parts {
            out.chunks.extend(part.chunks.iter().cloned());
            out.len += part.len;
        }
        out
    }

    fn gather<'a>(entries: impl Iterator<Item = &'a Bytes>) -> Chunks {
        let mut out = Chunks::default();
        let mut gather = BytesMut::new();
        for entry in entries {
            out.len += entry.len();
            if entry.len() >= GATHER_BELOW {
                if !gather.is_empty() {
                    out.chunks.push(gather.split().freeze());
                }
                out.chunks.push(entry.clone());
                continue;
            }
            if gather.is_empty() {
                gather.reserve(CHUNK);
            }
            gather.extend_from_slice(entry);
            if gather.len() >= CHUNK {
                out.chunks.push(gather.split().freeze());
            }
        }
        if !gather.is_empty() {
            out.chunks.push(gather.freeze());
        }
        out
    }
}

/// The response entries of a list of resources (a view's output, or a diff shared by the
/// streams of a view), gathered once per protocol and then shared by every stream that
/// sends them.
#[derive(Debug, Default)]
pub struct Gathered {
    delta: OnceLock<Chunks>,
    sotw: OnceLock<Chunks>,
}

impl Gathered {
    /// The delta entries of `resources` (the list this value belongs to).
    pub fn delta(&self, resources: &[Arc<Resource>]) -> &Chunks {
        self.delta
            .get_or_init(|| Chunks::gather(resources.iter().map(|r| r.delta_entry())))
    }

    /// The State-of-the-World entries of `resources`.
    pub fn sotw(&self, resources: &[Arc<Resource>]) -> &Chunks {
        self.sotw
            .get_or_init(|| Chunks::gather(resources.iter().map(|r| r.sotw_entry())))
    }
}
