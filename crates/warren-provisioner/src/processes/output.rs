//! A process's output as one log with byte offsets, bounded: what a client that went away
//! needs to reattach and resume where it stopped.
//!
//! Offsets count every byte the process wrote, on both streams, in the order warren read
//! them (after secret masking, I13), from 0. The log keeps the newest bytes up to its
//! capacity; a reader asking for bytes already dropped is told exactly which range it lost
//! and gets the rest.

use std::collections::VecDeque;

use warren_backend::OutputStream;

/// One piece of output, where it starts in the log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutputPiece {
    /// Which stream it came on (a terminal's output is `stdout`).
    pub stream: OutputStream,
    /// The offset of its first byte.
    pub offset: u64,
    /// The bytes (base64 as JSON).
    #[serde(with = "base64_bytes")]
    pub bytes: Vec<u8>,
}

/// What a read from an offset found.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct OutputRead {
    /// Bytes from the offset asked for up to the oldest byte kept were dropped from the
    /// log before this reader got them: `(from, to)`, `to` exclusive.
    pub lost: Option<(u64, u64)>,
    /// The pieces from the offset on (or from the oldest byte kept).
    pub pieces: Vec<OutputPiece>,
    /// Where the next read continues.
    pub next: u64,
}

/// Bytes as base64 text in JSON, a third larger rather than four times (a list of numbers).
mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize as _, Deserializer, Serializer};

    const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], out: S) -> Result<S::Ok, S::Error> {
        out.serialize_str(&B64.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(input)?;
        B64.decode(text).map_err(serde::de::Error::custom)
    }
}

/// The log.
#[derive(Debug)]
pub(crate) struct OutputLog {
    pieces: VecDeque<OutputPiece>,
    /// Offset of the oldest byte kept.
    start: u64,
    /// Offset after the newest byte.
    end: u64,
    capacity: usize,
}

impl OutputLog {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            pieces: VecDeque::new(),
            start: 0,
            end: 0,
            capacity: capacity.max(1),
        }
    }

    /// Offset of the oldest byte kept, and after the newest.
    pub(crate) fn bounds(&self) -> (u64, u64) {
        (self.start, self.end)
    }

    /// Appends `bytes`, dropping the oldest bytes beyond the capacity.
    pub(crate) fn push(&mut self, stream: OutputStream, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        // More than the whole capacity at once: only its newest part can be kept.
        let skip = bytes.len().saturating_sub(self.capacity);
        let kept = &bytes[skip..];
        self.end += skip as u64;
        match self.pieces.back_mut() {
            // Consecutive bytes of one stream make one piece: reads hand out fewer.
            Some(last)
                if last.stream == stream
                    && last.offset + last.bytes.len() as u64 == self.end
                    && last.bytes.len() + kept.len() <= 64 * 1024 =>
            {
                last.bytes.extend_from_slice(kept);
            }
            _ => self.pieces.push_back(OutputPiece {
                stream,
                offset: self.end,
                bytes: kept.to_vec(),
            }),
        }
        self.end += kept.len() as u64;
        let excess = (self.end - self.start).saturating_sub(self.capacity as u64);
        self.drop_oldest(excess);
        if self.pieces.is_empty() {
            self.start = self.end;
        }
    }

    fn drop_oldest(&mut self, mut excess: u64) {
        while excess > 0 {
            let Some(first) = self.pieces.front_mut() else {
                break;
            };
            // Bytes skipped before the first piece (an oversized push) go first.
            let gap = first.offset - self.start;
            if gap > 0 {
                let taken = gap.min(excess);
                self.start += taken;
                excess -= taken;
                continue;
            }
            let len = first.bytes.len() as u64;
            if len <= excess {
                self.start += len;
                excess -= len;
                self.pieces.pop_front();
            } else {
                first.bytes.drain(..excess as usize);
                first.offset += excess;
                self.start += excess;
                excess = 0;
            }
        }
    }

    /// Everything from `from` on, at most `limit` bytes.
    pub(crate) fn read(&self, from: u64, limit: usize) -> OutputRead {
        let from = from.min(self.end);
        let oldest = self
            .pieces
            .front()
            .map_or(self.end, |first| first.offset.max(self.start));
        let (lost, mut at) = if from < oldest {
            (Some((from, oldest)), oldest)
        } else {
            (None, from)
        };
        let mut pieces = Vec::new();
        let mut room = limit;
        for piece in &self.pieces {
            let piece_end = piece.offset + piece.bytes.len() as u64;
            if piece_end <= at || room == 0 {
                continue;
            }
            let skip = (at.saturating_sub(piece.offset)) as usize;
            let take = (piece.bytes.len() - skip).min(room);
            pieces.push(OutputPiece {
                stream: piece.stream,
                offset: piece.offset + skip as u64,
                bytes: piece.bytes[skip..skip + take].to_vec(),
            });
            room -= take;
            at = piece.offset + (skip + take) as u64;
        }
        OutputRead {
            lost,
            pieces,
            next: at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(read: &OutputRead) -> String {
        read.pieces
            .iter()
            .map(|p| String::from_utf8_lossy(&p.bytes).into_owned())
            .collect()
    }

    #[test]
    fn a_reader_resumes_at_its_offset_with_no_byte_lost_or_repeated() {
        let mut log = OutputLog::new(1024);
        log.push(OutputStream::Stdout, b"hello ");
        log.push(OutputStream::Stderr, b"oops ");
        log.push(OutputStream::Stdout, b"world");
        let first = log.read(0, 8);
        assert_eq!(text(&first), "hello oo");
        assert_eq!(first.next, 8);
        let rest = log.read(first.next, 1024);
        assert_eq!(text(&rest), "ps world");
        assert_eq!(rest.pieces[0].stream, OutputStream::Stderr);
        assert_eq!(rest.pieces[0].offset, 8);
        assert_eq!(rest.next, 16);
        assert!(log.read(16, 1024).pieces.is_empty());
    }

    #[test]
    fn bytes_beyond_the_capacity_are_dropped_oldest_first_and_reported_lost() {
        let mut log = OutputLog::new(10);
        log.push(OutputStream::Stdout, b"0123456789");
        log.push(OutputStream::Stdout, b"abcd");
        assert_eq!(log.bounds(), (4, 14));
        let read = log.read(0, 1024);
        assert_eq!(read.lost, Some((0, 4)));
        assert_eq!(text(&read), "456789abcd");
        assert_eq!(read.next, 14);
        // A reader that kept up loses nothing.
        let read = log.read(6, 1024);
        assert_eq!(read.lost, None);
        assert_eq!(text(&read), "6789abcd");
    }

    #[test]
    fn one_push_larger_than_the_capacity_keeps_its_newest_bytes() {
        let mut log = OutputLog::new(4);
        log.push(OutputStream::Stdout, b"ab");
        log.push(OutputStream::Stderr, b"0123456789");
        assert_eq!(log.bounds(), (8, 12));
        let read = log.read(0, 1024);
        assert_eq!(read.lost, Some((0, 8)));
        assert_eq!(text(&read), "6789");
        assert_eq!(read.pieces[0].offset, 8);
        assert_eq!(read.next, 12);
    }

    #[test]
    fn offsets_past_the_end_read_nothing_and_wait_at_the_end() {
        let mut log = OutputLog::new(16);
        log.push(OutputStream::Stdout, b"abc");
        let read = log.read(99, 1024);
        assert!(read.pieces.is_empty());
        assert_eq!(read.next, 3);
    }
}
