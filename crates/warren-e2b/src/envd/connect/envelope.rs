//! Envelopes, the frames of a streaming call: read off a request body as it arrives (gzip
//! inflated within the bound), written one per message, and the end-of-stream one.

use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};

use super::{
    Code, ConnectError, ENVELOPE_HEADER_BYTES, FLAG_COMPRESSED, FLAG_END_STREAM, MAX_MESSAGE_BYTES,
};

/// The chunks of a request body, as they arrive.
type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, axum::Error>> + Send>>;

/// Reads envelopes off a request body as its chunks arrive: an envelope may span chunks
/// and a chunk may hold several. Each envelope is bounded by [`MAX_MESSAGE_BYTES`],
/// refused from its header before its payload is buffered.
pub(super) struct EnvelopeReader {
    chunks: Chunks,
    buffer: BytesMut,
    /// Whether the call negotiated gzip: compressed envelopes (flag 0x01) are inflated.
    gzip: bool,
}

impl EnvelopeReader {
    /// A reader over a body's chunks.
    pub(super) fn new(
        chunks: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
    ) -> Self {
        Self {
            chunks: Box::pin(chunks),
            buffer: BytesMut::new(),
            gzip: false,
        }
    }

    /// Takes gzip-compressed envelopes, as the call negotiated.
    pub(super) fn gzip(mut self, gzip: bool) -> Self {
        self.gzip = gzip;
        self
    }

    /// The next envelope's message, `None` when the body ended between envelopes.
    pub(super) async fn next(&mut self) -> Option<Result<Bytes, ConnectError>> {
        loop {
            if let Some(envelope) = self.buffered() {
                return Some(envelope);
            }
            match self.chunks.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(error)) => return Some(Err(body_error(&error))),
                None if self.buffer.is_empty() => return None,
                None => {
                    return Some(Err(ConnectError::new(
                        Code::InvalidArgument,
                        "the request body ended inside an envelope",
                    )))
                }
            }
        }
    }

    /// The first envelope of the buffer, once its header is in (to refuse it early) or its
    /// whole message is.
    fn buffered(&mut self) -> Option<Result<Bytes, ConnectError>> {
        let header: [u8; ENVELOPE_HEADER_BYTES] =
            self.buffer.get(..ENVELOPE_HEADER_BYTES)?.try_into().ok()?;
        let flags = header[0];
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let length = usize::try_from(length).unwrap_or(usize::MAX);
        let compressed = flags & FLAG_COMPRESSED != 0;
        if compressed && !self.gzip {
            return Some(Err(ConnectError::new(
                Code::InvalidArgument,
                "a compressed envelope, but the call negotiated no compression",
            )));
        }
        if flags & !FLAG_COMPRESSED != 0 {
            // End-of-stream (0x02) is the server's alone; other bits are undefined.
            return Some(Err(ConnectError::new(
                Code::InvalidArgument,
                format!("an envelope with unexpected flags {flags:#04x}"),
            )));
        }
        if length > MAX_MESSAGE_BYTES {
            return Some(Err(too_large(length)));
        }
        if self.buffer.len() < ENVELOPE_HEADER_BYTES + length {
            return None;
        }
        self.buffer.advance(ENVELOPE_HEADER_BYTES);
        let message = self.buffer.split_to(length).freeze();
        if compressed {
            return Some(inflate(&message));
        }
        Some(Ok(message))
    }
}

/// A gzip-compressed message, inflated within [`MAX_MESSAGE_BYTES`]: a small compressed
/// message may not grow past the bound an uncompressed one is held to.
pub(super) fn inflate(compressed: &[u8]) -> Result<Bytes, ConnectError> {
    use std::io::Read as _;
    let limit = u64::try_from(MAX_MESSAGE_BYTES).unwrap_or(u64::MAX) + 1;
    let mut inflated = Vec::new();
    flate2::read::GzDecoder::new(compressed)
        .take(limit)
        .read_to_end(&mut inflated)
        .map_err(|error| {
            ConnectError::new(
                Code::InvalidArgument,
                format!("the message is not valid gzip: {error}"),
            )
        })?;
    if inflated.len() > MAX_MESSAGE_BYTES {
        return Err(too_large(inflated.len()));
    }
    Ok(Bytes::from(inflated))
}

/// Reads and drops a request body answered without being read, at most 1 MiB and for at
/// most a second: enough for any request a refused client sends (a Start, a small
/// upload), and no way to hold a server task on a large or stalled one.
pub(crate) async fn drain_body(body: Body) {
    const LIMIT: usize = 1024 * 1024;
    let drain = async {
        let mut chunks = body.into_data_stream();
        let mut seen = 0usize;
        while let Some(Ok(chunk)) = chunks.next().await {
            seen = seen.saturating_add(chunk.len());
            if seen > LIMIT {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// A body read whole, refused once it passes `limit` bytes.
pub(super) async fn read_bounded(body: Body, limit: usize) -> Result<Bytes, ConnectError> {
    let mut chunks = body.into_data_stream();
    let mut buffer = BytesMut::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|error| body_error(&error))?;
        if buffer.len() + chunk.len() > limit {
            return Err(too_large(buffer.len() + chunk.len()));
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok(buffer.freeze())
}

/// One envelope: flags, length, message.
pub(super) fn envelope(flags: u8, message: &[u8]) -> Result<Bytes, ConnectError> {
    let length = u32::try_from(message.len()).map_err(|_| {
        ConnectError::new(
            Code::ResourceExhausted,
            "a message too large for an envelope",
        )
    })?;
    let mut bytes = BytesMut::with_capacity(ENVELOPE_HEADER_BYTES + message.len());
    bytes.extend_from_slice(&[flags]);
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes.extend_from_slice(message);
    Ok(bytes.freeze())
}

/// The end-of-stream envelope: always JSON, whatever the call's codec – `{}`, or
/// `{"error": {...}}`.
pub(super) fn end_of_stream(error: Option<&ConnectError>) -> Bytes {
    let message = match error {
        None => serde_json::json!({}),
        Some(error) => serde_json::json!({ "error": error.to_json() }),
    };
    let message = message.to_string();
    // A few hundred bytes at most: within an envelope's u32 length.
    envelope(FLAG_END_STREAM, message.as_bytes()).unwrap_or_default()
}

/// The error for a message over [`MAX_MESSAGE_BYTES`].
fn too_large(length: usize) -> ConnectError {
    ConnectError::new(
        Code::ResourceExhausted,
        format!("a request message of {length} bytes or more; the limit is {MAX_MESSAGE_BYTES}"),
    )
}

/// The error for a request body that failed mid-read (the client went away, mostly).
fn body_error(error: &axum::Error) -> ConnectError {
    ConnectError::new(Code::Canceled, format!("reading the request body: {error}"))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use axum::http::header::{HeaderName, HeaderValue};
    use futures::stream;

    use super::*;
    use crate::envd::connect::test_support::{
        chunked, client_envelope, envelopes_of, gzipped, json, request,
    };
    use crate::envd::connect::{Call, STREAM_CONTENT_ENCODING};

    #[tokio::test]
    async fn an_envelope_written_is_read_back_unchanged() {
        let written = client_envelope(b"{\"pid\":7}");
        assert_eq!(written[..5], [0, 0, 0, 0, 9]);
        let mut reader = EnvelopeReader::new(chunked(vec![written]).into_data_stream());
        assert_eq!(reader.next().await.unwrap().unwrap(), &b"{\"pid\":7}"[..]);
        assert!(reader.next().await.is_none());
    }

    #[tokio::test]
    async fn envelopes_split_across_and_packed_into_chunks_are_read_whole() {
        let first = client_envelope(b"first message");
        let second = client_envelope(b"second");
        let third = client_envelope(b"");
        // Byte by byte for the first, then the second and third sharing one chunk.
        let mut chunks: Vec<Vec<u8>> = first.iter().map(|byte| vec![*byte]).collect();
        chunks.push([second, third].concat());
        let mut reader = EnvelopeReader::new(chunked(chunks).into_data_stream());
        assert_eq!(reader.next().await.unwrap().unwrap(), &b"first message"[..]);
        assert_eq!(reader.next().await.unwrap().unwrap(), &b"second"[..]);
        assert_eq!(reader.next().await.unwrap().unwrap(), &b""[..]);
        assert!(reader.next().await.is_none());
    }

    #[tokio::test]
    async fn a_body_that_ends_inside_an_envelope_is_an_invalid_argument() {
        let mut truncated = client_envelope(b"cut short");
        truncated.truncate(8);
        let mut reader = EnvelopeReader::new(chunked(vec![truncated]).into_data_stream());
        let error = reader.next().await.unwrap().unwrap_err();
        assert_eq!(error.code, Code::InvalidArgument);
    }

    #[tokio::test]
    async fn an_oversize_envelope_is_refused_from_its_header_alone() {
        let length = u32::try_from(MAX_MESSAGE_BYTES + 1).unwrap();
        let mut header = vec![0];
        header.extend_from_slice(&length.to_be_bytes());
        // Only the header arrives: the refusal must not wait for the payload.
        let pending = stream::iter(vec![Ok::<_, Infallible>(header)]).chain(stream::pending());
        let mut reader = EnvelopeReader::new(Body::from_stream(pending).into_data_stream());
        let error = reader.next().await.unwrap().unwrap_err();
        assert_eq!(error.code, Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn end_of_stream_without_an_error_is_an_empty_object() {
        let envelopes = envelopes_of(&end_of_stream(None));
        assert_eq!(envelopes, vec![(FLAG_END_STREAM, b"{}".to_vec())]);
    }

    #[tokio::test]
    async fn end_of_stream_with_an_error_carries_its_code_and_message() {
        let error = ConnectError::new(Code::NotFound, "process 7 not found");
        let envelopes = envelopes_of(&end_of_stream(Some(&error)));
        assert_eq!(envelopes.len(), 1);
        assert_eq!(envelopes[0].0, FLAG_END_STREAM);
        assert_eq!(
            json(&envelopes[0].1),
            serde_json::json!({"error": {"code": "not_found", "message": "process 7 not found"}})
        );
    }

    #[tokio::test]
    async fn gzip_envelopes_are_inflated_and_a_gzip_bomb_stops_at_the_bound() {
        let mut envelope = client_envelope(&gzipped(br#"{"process":{"cmd":"ls"}}"#));
        envelope[0] = FLAG_COMPRESSED;
        let mut streaming = request("application/connect+json", chunked(vec![envelope]));
        streaming.headers_mut().insert(
            HeaderName::from_static(STREAM_CONTENT_ENCODING),
            HeaderValue::from_static("gzip"),
        );
        let mut call = Call::from_request(streaming).ok().unwrap();
        let start: crate::envd::proto::process::StartRequest = call.message().await.unwrap();
        assert_eq!(start.process.unwrap().cmd, "ls");

        let bomb = gzipped(&vec![b' '; MAX_MESSAGE_BYTES + 1]);
        assert!(bomb.len() < MAX_MESSAGE_BYTES / 100, "a bomb is small");
        let error = inflate(&bomb).unwrap_err();
        assert_eq!(error.code, Code::ResourceExhausted);
    }
}
