//! The Connect protocol as envd speaks it: unary and streaming calls, the JSON and binary
//! protobuf codecs, envelopes and end-of-stream messages, and Connect's error format.
//!
//! A unary call is a plain request and response body (`application/json`,
//! `application/proto`); its errors are HTTP statuses with a JSON body. A streaming call
//! (`application/connect+json`, `application/connect+proto`) carries envelopes both ways –
//! a flags byte, a big-endian `u32` length, the message – and its answer is always `200`,
//! closed by an end-of-stream envelope (always JSON) that holds the call's error, if any.
//!
//! E2B's SDKs use the JSON codec (the Python SDK's connectrpc with a proto3-JSON codec, the
//! JS SDK's connect-web without the binary format) and never compress; other Connect
//! clients (protobuf ones such as AgentScope's) send gzip by default, so gzip requests are
//! taken (each message inflated within the same size bound), and answers are never
//! compressed (identity, which every Connect client accepts).

mod answer;
mod call;
mod codec;
mod envelope;
mod error;

pub(crate) use answer::unary_error;
pub(crate) use call::Call;
// Only the watch's tests reach it from outside; `Call::keepalive` is how handlers do.
#[cfg(test)]
pub(crate) use call::keepalive_of;
pub(crate) use codec::{Codec, Message};
pub(crate) use envelope::drain_body;
pub(crate) use error::{sandbox_gone_message, Code, ConnectError};

/// The largest request message warren reads, unary body or one envelope: 16 MiB. envd's
/// requests are small (paths, a command line) except input written to a process, which the
/// SDKs send as the caller hands it over; the bound keeps one call from holding an
/// unbounded buffer while leaving room for any input a caller sends in one piece.
pub(crate) const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// An envelope's header: one flags byte, then the message's length (big-endian `u32`).
const ENVELOPE_HEADER_BYTES: usize = 5;

/// The envelope flag of a compressed message.
const FLAG_COMPRESSED: u8 = 0x01;

/// The envelope flag of the end-of-stream message (server to client only).
const FLAG_END_STREAM: u8 = 0x02;

/// What a `415` names as acceptable (`Accept-Post`).
const ACCEPTED_CONTENT_TYPES: &str =
    "application/json, application/proto, application/connect+json, application/connect+proto";

/// `Connect-Protocol-Version`: the protocol revision a client speaks.
const PROTOCOL_VERSION: &str = "connect-protocol-version";

/// `Connect-Timeout-Ms`: the client's deadline for the call.
const TIMEOUT_MS: &str = "connect-timeout-ms";

/// `Connect-Content-Encoding`: how a streaming call's envelopes are compressed.
const STREAM_CONTENT_ENCODING: &str = "connect-content-encoding";

/// `Connect-Accept-Encoding`: the compressions a streaming peer accepts.
const STREAM_ACCEPT_ENCODING: &str = "connect-accept-encoding";

/// `Accept-Post`: the content types a `415` names as accepted.
const ACCEPT_POST: &str = "accept-post";

#[cfg(test)]
mod test_support {
    //! Requests, bodies, envelopes and answers as the tests of every part of the protocol
    //! build and read them.

    use std::convert::Infallible;

    use axum::body::Body;
    use axum::extract::Request;
    use axum::http::header::CONTENT_TYPE;
    use axum::http::Request as HttpRequest;
    use axum::response::Response;
    use bytes::Bytes;
    use futures::stream;

    use super::envelope::envelope;
    use super::Call;

    /// A request with this content type and body.
    pub(super) fn request(content_type: &str, body: Body) -> Request {
        HttpRequest::builder()
            .method("POST")
            .uri("/process.Process/Start")
            .header(CONTENT_TYPE, content_type)
            .body(body)
            .unwrap()
    }

    /// A body that arrives in these chunks.
    pub(super) fn chunked(chunks: Vec<Vec<u8>>) -> Body {
        Body::from_stream(stream::iter(chunks.into_iter().map(Ok::<_, Infallible>)))
    }

    /// A call of this content type over this body; panics if the request is refused.
    pub(super) fn call(content_type: &str, body: Body) -> Call {
        Call::from_request(request(content_type, body))
            .unwrap_or_else(|response| panic!("refused: {}", response.status()))
    }

    /// A response's whole body.
    pub(super) async fn body_of(response: Response) -> Bytes {
        axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap()
    }

    /// The envelopes of a streamed answer, as (flags, message).
    pub(super) fn envelopes_of(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut envelopes = Vec::new();
        while !bytes.is_empty() {
            let length = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
            envelopes.push((bytes[0], bytes[5..5 + length].to_vec()));
            bytes = &bytes[5 + length..];
        }
        envelopes
    }

    /// An envelope of a message, as a client sends it.
    pub(super) fn client_envelope(message: &[u8]) -> Vec<u8> {
        envelope(0, message).unwrap().to_vec()
    }

    /// The JSON of a response body.
    pub(super) fn json(bytes: &[u8]) -> serde_json::Value {
        serde_json::from_slice(bytes).unwrap()
    }

    pub(super) fn gzipped(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }
}
