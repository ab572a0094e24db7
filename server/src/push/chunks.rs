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
        let entries: Vec<&Bytes> = entries.collect();
        let mut out = Chunks::default();
        let mut at = 0;
        while at < entries.len() {
            if entries[at].len() >= GATHER_BELOW {
                out.len += entries[at].len();
                out.chunks.push(entries[at].clone());
                at += 1;
                continue;
            }
            // A run of small entries up to about CHUNK bytes, copied into a buffer of
            // exactly its size: a chunk outlives the push (outputs and shared diffs keep
            // theirs), so spare capacity would be held as long as they are.
            let mut end = at;
            let mut len = 0;
            while end < entries.len() && entries[end].len() < GATHER_BELOW && len < CHUNK {
                len += entries[end].len();
                end += 1;
            }
            out.len += len;
            out.chunks
                .push(copied(entries[at..end].iter().copied(), len));
            at = end;
        }
        out
    }
}

/// `parts` (`len` bytes in all) copied into one buffer of exactly that size.
pub fn copied<'a>(parts: impl IntoIterator<Item = &'a Bytes>, len: usize) -> Bytes {
    let mut run = BytesMut::with_capacity(len);
    for part in parts {
        run.extend_from_slice(part);
    }
    run.freeze()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_small_entries_in_order_and_shares_large_ones() {
        let small: Vec<Bytes> = (0..40u8).map(|i| Bytes::from(vec![i; 3000])).collect();
        let large = Bytes::from(vec![255u8; GATHER_BELOW]);
        let mut entries: Vec<&Bytes> = small[..30].iter().collect();
        entries.push(&large);
        entries.extend(small[30..].iter());
        let chunks = Chunks::gather(entries.iter().copied());

        let joined: Vec<u8> = chunks
            .chunks
            .iter()
            .flat_map(|c| c.iter().copied())
            .collect();
        let want: Vec<u8> = entries.iter().flat_map(|e| e.iter().copied()).collect();
        assert_eq!(joined, want);
        assert_eq!(chunks.len, want.len());
        // 30 small entries (90,000 bytes) make two chunks, the first up to CHUNK; the large
        // entry is its own (shared) chunk; the 10 after it one more.
        let lens: Vec<usize> = chunks.chunks.iter().map(Bytes::len).collect();
        assert_eq!(lens, vec![66_000, 24_000, GATHER_BELOW, 30_000]);
        assert_eq!(chunks.chunks[2].as_ptr(), large.as_ptr());
    }
}
