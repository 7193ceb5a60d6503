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

use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{
    HeaderName, HeaderValue, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE,
};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};

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

/// A request or response message of envd's: binary protobuf through prost, proto3's JSON
/// mapping through serde (pbjson). Every generated type in `super::proto` is one.
pub(crate) trait Message:
    prost::Message + Default + serde::Serialize + serde::de::DeserializeOwned + Send + 'static
{
}

impl<T> Message for T where
    T: prost::Message + Default + serde::Serialize + serde::de::DeserializeOwned + Send + 'static
{
}

/// How messages are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    /// `application/json`, `application/connect+json`: proto3's JSON mapping.
    Json,
    /// `application/proto`, `application/connect+proto`: binary protobuf.
    Proto,
}

impl Codec {
    /// The content type of a call's answer in this codec.
    fn content_type(self, streaming: bool) -> &'static str {
        match (self, streaming) {
            (Self::Json, false) => "application/json",
            (Self::Proto, false) => "application/proto",
            (Self::Json, true) => "application/connect+json",
            (Self::Proto, true) => "application/connect+proto",
        }
    }

    /// A message's bytes in this codec.
    fn encode<T: Message>(self, message: &T) -> Result<Vec<u8>, ConnectError> {
        match self {
            Self::Json => serde_json::to_vec(message).map_err(|error| {
                ConnectError::new(Code::Internal, format!("encoding the answer: {error}"))
            }),
            Self::Proto => Ok(message.encode_to_vec()),
        }
    }

    /// A message from its bytes in this codec. An empty JSON body is taken as the empty
    /// message, as an empty protobuf body is.
    fn decode<T: Message>(self, bytes: &[u8]) -> Result<T, ConnectError> {
        let invalid = |error: &dyn std::fmt::Display| {
            ConnectError::new(
                Code::InvalidArgument,
                format!("decoding the request message: {error}"),
            )
        };
        match self {
            Self::Json if bytes.iter().all(u8::is_ascii_whitespace) => Ok(T::default()),
            Self::Json => serde_json::from_slice(bytes).map_err(|error| invalid(&error)),
            Self::Proto => T::decode(bytes).map_err(|error| invalid(&error)),
        }
    }
}

/// Connect's error codes: the protocol's whole set, of which warren's envd produces most
/// (not `out_of_range` or `data_loss`, kept so the table stays the protocol's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) enum Code {
    /// `canceled`
    Canceled,
    /// `unknown`
    Unknown,
    /// `invalid_argument`
    InvalidArgument,
    /// `deadline_exceeded`
    DeadlineExceeded,
    /// `not_found`
    NotFound,
    /// `already_exists`
    AlreadyExists,
    /// `permission_denied`
    PermissionDenied,
    /// `resource_exhausted`
    ResourceExhausted,
    /// `failed_precondition`
    FailedPrecondition,
    /// `aborted`
    Aborted,
    /// `out_of_range`
    OutOfRange,
    /// `unimplemented`
    Unimplemented,
    /// `internal`
    Internal,
    /// `unavailable`
    Unavailable,
    /// `data_loss`
    DataLoss,
    /// `unauthenticated`
    Unauthenticated,
}

impl Code {
    /// The code's name on the wire.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Canceled => "canceled",
            Self::Unknown => "unknown",
            Self::InvalidArgument => "invalid_argument",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::PermissionDenied => "permission_denied",
            Self::ResourceExhausted => "resource_exhausted",
            Self::FailedPrecondition => "failed_precondition",
            Self::Aborted => "aborted",
            Self::OutOfRange => "out_of_range",
            Self::Unimplemented => "unimplemented",
            Self::Internal => "internal",
            Self::Unavailable => "unavailable",
            Self::DataLoss => "data_loss",
            Self::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code, as the Connect protocol's table has
    /// it (the revision that moved `canceled` to 499, `deadline_exceeded` to 504,
    /// `failed_precondition` to 400 and `unimplemented` to 501). Clients read the code from
    /// the body; the status matters to proxies and to plain HTTP tools.
    pub(crate) fn http_status(self) -> StatusCode {
        let status = match self {
            Self::Canceled => 499,
            Self::Unknown | Self::Internal | Self::DataLoss => 500,
            Self::InvalidArgument | Self::FailedPrecondition | Self::OutOfRange => 400,
            Self::DeadlineExceeded => 504,
            Self::NotFound => 404,
            Self::AlreadyExists | Self::Aborted => 409,
            Self::PermissionDenied => 403,
            Self::ResourceExhausted => 429,
            Self::Unimplemented => 501,
            Self::Unavailable => 503,
            Self::Unauthenticated => 401,
        };
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Connect error: a code and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub(crate) struct ConnectError {
    /// The code.
    pub(crate) code: Code,
    /// The message.
    pub(crate) message: String,
    /// The HTTP status of a unary answer, where it is not the code's (E2B's proxy answers
    /// 502 for a sandbox that is gone).
    pub(crate) status: Option<StatusCode>,
}

impl ConnectError {
    /// An error with this code and message.
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            status: None,
            message: message.into(),
        }
    }

    /// A sandbox that is gone, paused or was never there, as E2B's proxy answers it: 502,
    /// `unavailable`, "… was not found", which the SDKs turn into their
    /// `SandboxNotRunning` error.
    pub(crate) fn sandbox_gone(sandbox_id: &str) -> Self {
        Self {
            code: Code::Unavailable,
            status: Some(StatusCode::BAD_GATEWAY),
            message: sandbox_gone_message(sandbox_id),
        }
    }

    /// The error as Connect's JSON: `{"code": "...", "message": "..."}`, the message left
    /// out when empty.
    fn to_json(&self) -> serde_json::Value {
        let mut error = serde_json::Map::new();
        error.insert("code".into(), self.code.as_str().into());
        if !self.message.is_empty() {
            error.insert("message".into(), self.message.clone().into());
        }
        serde_json::Value::Object(error)
    }
}

/// One incoming call.
pub(crate) struct Call {
    headers: HeaderMap,
    codec: Codec,
    streaming: bool,
    timeout: Option<Duration>,
    /// The request body, until a handler reads its message(s). In a mutex only so that a
    /// `Call` is `Sync` (a body is not), letting handlers hold `&Call` across an `.await`
    /// in a future axum needs `Send`; it is only ever reached through `&mut self`.
    body: Mutex<Option<Body>>,
    /// Whether the request's messages are gzip-compressed (`Content-Encoding` for a unary
    /// call, `Connect-Content-Encoding` for a streaming one).
    gzip: bool,
}

impl Call {
    /// Reads the codec and kind of call from the request; a request Connect does not
    /// describe is answered at once: `415` for a content type that is not Connect's, an
    /// error in the call's own form for a bad protocol version, timeout or compression.
    // The error is the answer itself, built once per refused request and sent at once:
    // boxing it would only make every caller unbox it.
    #[allow(clippy::result_large_err)]
    pub(crate) fn from_request(request: Request) -> Result<Self, Response> {
        let (parts, body) = request.into_parts();
        let Some((codec, streaming)) = parse_content_type(&parts.headers) else {
            return Err(unsupported_media_type(&parts.headers));
        };
        let mut call = Self {
            headers: parts.headers,
            codec,
            streaming,
            timeout: None,
            body: Mutex::new(Some(body)),
            gzip: false,
        };
        if let Err(response) = call.check_headers() {
            return Err(*response);
        }
        Ok(call)
    }

    /// Checks the Connect headers a call may carry, and reads its timeout.
    fn check_headers(&mut self) -> Result<(), Box<Response>> {
        if let Some(version) = self.headers.get(PROTOCOL_VERSION) {
            if version.as_bytes() != b"1" {
                return Err(Box::new(self.error(ConnectError::new(
                    Code::InvalidArgument,
                    "Connect-Protocol-Version must be 1",
                ))));
            }
        }
        // gzip and identity are taken; anything else is `unimplemented`, naming what is
        // accepted, as Connect answers an unsupported compression.
        let encoding = if self.streaming {
            HeaderName::from_static(STREAM_CONTENT_ENCODING)
        } else {
            CONTENT_ENCODING
        };
        if let Some(value) = self.headers.get(&encoding) {
            let value = value.as_bytes();
            if value.eq_ignore_ascii_case(b"gzip") {
                self.gzip = true;
            } else if !value.eq_ignore_ascii_case(b"identity") {
                let mut response = self.error(ConnectError::new(
                    Code::Unimplemented,
                    format!(
                        "compression {:?} is not supported; send gzip or identity",
                        String::from_utf8_lossy(value)
                    ),
                ));
                let accept = if self.streaming {
                    HeaderName::from_static(STREAM_ACCEPT_ENCODING)
                } else {
                    ACCEPT_ENCODING
                };
                response
                    .headers_mut()
                    .insert(accept, HeaderValue::from_static("gzip, identity"));
                return Err(Box::new(response));
            }
        }
        if let Some(value) = self.headers.get(TIMEOUT_MS) {
            match parse_timeout(value) {
                Some(timeout) => self.timeout = Some(timeout),
                None => {
                    return Err(Box::new(self.error(ConnectError::new(
                        Code::InvalidArgument,
                        "Connect-Timeout-Ms must be 1 to 10 digits",
                    ))))
                }
            }
        }
        Ok(())
    }

    /// The request's headers.
    pub(crate) fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The keepalive interval the client asked for (see [`keepalive_of`]).
    pub(crate) fn keepalive(&self, default: Duration, max: Duration) -> Duration {
        keepalive_of(&self.headers, default, max)
    }

    /// How the call's messages are encoded.
    #[cfg(test)]
    pub(crate) fn codec(&self) -> Codec {
        self.codec
    }

    /// Whether the call is a streaming one (`application/connect+…`): its messages come in
    /// envelopes and it is answered with envelopes.
    #[cfg(test)]
    pub(crate) fn is_streaming(&self) -> bool {
        self.streaming
    }

    /// The client's deadline for the call (`Connect-Timeout-Ms`), if it set one.
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Checks that the call is of the kind its method is: a unary method takes unary
    /// content types, a streaming one (server- or client-streaming) streaming ones. Connect
    /// answers a mismatch as an unsupported content type.
    #[allow(clippy::result_large_err)] // The answer itself, as `from_request`'s.
    pub(crate) fn require_streaming(&self, streaming: bool) -> Result<(), Response> {
        if self.streaming == streaming {
            Ok(())
        } else {
            Err(unsupported_media_type(&self.headers))
        }
    }

    /// The request body, the first time only.
    fn take_body(&mut self) -> Option<Body> {
        self.body
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Reads and drops what is left of the request body, so an HTTP/1.1 connection stays
    /// usable for the client's next request when the call is answered without reading it
    /// (an unknown sandbox, a wrong token). hyper closes a connection whose request body
    /// was left unread, and a client that reuses it from its pool at that moment fails
    /// with a broken pipe. Bounded: past [`drain_body`]'s limits the connection closes.
    pub(crate) async fn drain(&mut self) {
        if let Some(body) = self.take_body() {
            drain_body(body).await;
        }
    }

    /// The call's one request message: the body of a unary call, the single envelope of a
    /// server-streaming one. The body can be read once.
    pub(crate) async fn message<T: Message>(&mut self) -> Result<T, ConnectError> {
        let body = self.take_body().ok_or_else(already_read)?;
        if !self.streaming {
            let bytes = read_bounded(body, MAX_MESSAGE_BYTES).await?;
            if self.gzip {
                return self.codec.decode(&inflate(&bytes)?);
            }
            return self.codec.decode(&bytes);
        }
        let mut envelopes = EnvelopeReader::new(body.into_data_stream()).gzip(self.gzip);
        let first = envelopes.next().await.unwrap_or_else(|| {
            Err(ConnectError::new(
                Code::InvalidArgument,
                "the request stream holds no message",
            ))
        })?;
        match envelopes.next().await {
            None => self.codec.decode(&first),
            Some(Err(error)) => Err(error),
            Some(Ok(_)) => Err(ConnectError::new(
                Code::InvalidArgument,
                "the request stream holds more than one message",
            )),
        }
    }

    /// The request messages of a client-streaming call, decoded as their envelopes arrive
    /// (the body is never buffered whole; each envelope is bounded). The stream ends when
    /// the client closes its side, or after the first error. A unary call yields its one
    /// message. The body can be read once.
    pub(crate) fn messages<T: Message>(
        &mut self,
    ) -> impl Stream<Item = Result<T, ConnectError>> + Send + 'static {
        let codec = self.codec;
        let source = match self.take_body() {
            None => Source::Failed(already_read()),
            Some(body) if self.streaming => {
                Source::Envelopes(EnvelopeReader::new(body.into_data_stream()).gzip(self.gzip))
            }
            Some(body) => Source::Unary(body),
        };
        futures::stream::unfold(source, move |source| async move {
            match source {
                Source::Done => None,
                Source::Failed(error) => Some((Err(error), Source::Done)),
                Source::Unary(body) => {
                    let message = match read_bounded(body, MAX_MESSAGE_BYTES).await {
                        Ok(bytes) => codec.decode(&bytes),
                        Err(error) => Err(error),
                    };
                    Some((message, Source::Done))
                }
                Source::Envelopes(mut envelopes) => match envelopes.next().await? {
                    Ok(payload) => match codec.decode(&payload) {
                        Ok(message) => Some((Ok(message), Source::Envelopes(envelopes))),
                        Err(error) => Some((Err(error), Source::Done)),
                    },
                    Err(error) => Some((Err(error), Source::Done)),
                },
            }
        })
    }

    /// A successful answer of one message. On a streaming call (a client-streaming method's
    /// answer) that is one envelope and the end of the stream.
    pub(crate) fn unary<T: Message>(&self, message: &T) -> Response {
        let bytes = match self.codec.encode(message) {
            Ok(bytes) => bytes,
            Err(error) => return self.error(error),
        };
        if self.streaming {
            let body = match envelope(0, &bytes) {
                Ok(envelope) => [envelope, end_of_stream(None)].concat(),
                Err(error) => end_of_stream(Some(&error)).to_vec(),
            };
            return respond(StatusCode::OK, self.codec.content_type(true), body.into());
        }
        respond(
            StatusCode::OK,
            self.codec.content_type(false),
            Body::from(bytes),
        )
    }

    /// A streaming answer: `200`, then one envelope per message as the stream yields them,
    /// then the end-of-stream envelope – `{}`, or the error the stream yielded, after which
    /// nothing more of the stream is read. The answer always ends with it, so a client
    /// knows a stream that ended from one that was cut.
    pub(crate) fn stream<T, S>(&self, stream: S) -> Response
    where
        T: Message,
        S: Stream<Item = Result<T, ConnectError>> + Send + 'static,
    {
        let codec = self.codec;
        let envelopes = futures::stream::unfold(Some(Box::pin(stream)), move |state| async move {
            let mut stream = state?;
            let item = match stream.next().await {
                None => return Some((end_of_stream(None), None)),
                Some(item) => item,
            };
            match item.and_then(|message| envelope(0, &codec.encode(&message)?)) {
                Ok(envelope) => Some((envelope, Some(stream))),
                Err(error) => Some((end_of_stream(Some(&error)), None)),
            }
        })
        .map(Ok::<_, std::convert::Infallible>);
        respond(
            StatusCode::OK,
            codec.content_type(true),
            Body::from_stream(envelopes),
        )
    }

    /// Answers the call with an error, in the form its kind (unary or streaming) takes: a
    /// unary error, or a `200` whose only envelope is an end-of-stream holding the error.
    pub(crate) fn error(&self, error: ConnectError) -> Response {
        if self.streaming {
            respond(
                StatusCode::OK,
                self.codec.content_type(true),
                Body::from(end_of_stream(Some(&error))),
            )
        } else {
            unary_error(self.codec, &error)
        }
    }
}

/// The header the SDKs name a stream's keepalive interval in, in seconds.
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";

/// The keepalive interval `headers` ask for (`Keepalive-Ping-Interval`), within 1 s and
/// `max`; `default` when they ask for none (or for something that is no number).
pub(crate) fn keepalive_of(headers: &HeaderMap, default: Duration, max: Duration) -> Duration {
    headers
        .get(KEEPALIVE_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(|seconds| Duration::from_secs(seconds).clamp(Duration::from_secs(1), max))
        .unwrap_or(default)
}

/// E2B's words for a sandbox that is gone: the SDKs match on "was not found".
pub(crate) fn sandbox_gone_message(sandbox_id: &str) -> String {
    format!(
        "The sandbox {} was not found: it was killed, paused or reached its timeout",
        crate::error::shorten(sandbox_id)
    )
}

/// A unary call's error answer: the code's HTTP status and the error as JSON. Connect
/// sends unary errors as JSON whatever the call's codec, so `_codec` does not change it.
pub(crate) fn unary_error(_codec: Codec, error: &ConnectError) -> Response {
    respond(
        error.status.unwrap_or(error.code.http_status()),
        "application/json",
        Body::from(error.to_json().to_string()),
    )
}

/// Where [`Call::messages`] reads from.
enum Source {
    /// A streaming call's envelopes.
    Envelopes(EnvelopeReader),
    /// A unary call's body: one message.
    Unary(Body),
    /// An error to yield before ending.
    Failed(ConnectError),
    /// Nothing more.
    Done,
}

/// The chunks of a request body, as they arrive.
type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, axum::Error>> + Send>>;

/// Reads envelopes off a request body as its chunks arrive: an envelope may span chunks
/// and a chunk may hold several. Each envelope is bounded by [`MAX_MESSAGE_BYTES`],
/// refused from its header before its payload is buffered.
struct EnvelopeReader {
    chunks: Chunks,
    buffer: BytesMut,
    /// Whether the call negotiated gzip: compressed envelopes (flag 0x01) are inflated.
    gzip: bool,
}

impl EnvelopeReader {
    /// A reader over a body's chunks.
    fn new(chunks: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static) -> Self {
        Self {
            chunks: Box::pin(chunks),
            buffer: BytesMut::new(),
            gzip: false,
        }
    }

    /// Takes gzip-compressed envelopes, as the call negotiated.
    fn gzip(mut self, gzip: bool) -> Self {
        self.gzip = gzip;
        self
    }

    /// The next envelope's message, `None` when the body ended between envelopes.
    async fn next(&mut self) -> Option<Result<Bytes, ConnectError>> {
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
fn inflate(compressed: &[u8]) -> Result<Bytes, ConnectError> {
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
async fn read_bounded(body: Body, limit: usize) -> Result<Bytes, ConnectError> {
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
fn envelope(flags: u8, message: &[u8]) -> Result<Bytes, ConnectError> {
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
fn end_of_stream(error: Option<&ConnectError>) -> Bytes {
    let message = match error {
        None => serde_json::json!({}),
        Some(error) => serde_json::json!({ "error": error.to_json() }),
    };
    let message = message.to_string();
    // A few hundred bytes at most: within an envelope's u32 length.
    envelope(FLAG_END_STREAM, message.as_bytes()).unwrap_or_default()
}

/// An answer with a status, a content type and a body.
fn respond(status: StatusCode, content_type: &'static str, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The codec and kind (streaming or not) a request's content type names; `None` for one
/// Connect does not define. A `charset=utf-8` parameter is allowed (browsers add it).
fn parse_content_type(headers: &HeaderMap) -> Option<(Codec, bool)> {
    let value = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let mut parts = value.split(';');
    let media_type = parts.next()?.trim().to_ascii_lowercase();
    for parameter in parts {
        let parameter = parameter.trim().to_ascii_lowercase().replace(' ', "");
        if !parameter.is_empty() && parameter != "charset=utf-8" {
            return None;
        }
    }
    match media_type.as_str() {
        "application/json" => Some((Codec::Json, false)),
        "application/proto" => Some((Codec::Proto, false)),
        "application/connect+json" => Some((Codec::Json, true)),
        "application/connect+proto" => Some((Codec::Proto, true)),
        _ => None,
    }
}

/// The `415` for a content type that is not Connect's (or not the method's kind): with
/// `Accept-Post` naming Connect's, and a JSON error for a human reading it. No Connect
/// codec can be trusted here, so the body is plain Connect error JSON with the code a
/// client derives from `415` (`unknown`).
fn unsupported_media_type(headers: &HeaderMap) -> Response {
    let content_type = headers
        .get(CONTENT_TYPE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .unwrap_or_default();
    let error = ConnectError::new(
        Code::Unknown,
        format!(
            "unsupported content type {content_type:?}; this method takes {ACCEPTED_CONTENT_TYPES}"
        ),
    );
    let mut response = respond(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "application/json",
        Body::from(error.to_json().to_string()),
    );
    response.headers_mut().insert(
        HeaderName::from_static(ACCEPT_POST),
        HeaderValue::from_static(ACCEPTED_CONTENT_TYPES),
    );
    response
}

/// `Connect-Timeout-Ms`: 1 to 10 ASCII digits, milliseconds.
fn parse_timeout(value: &HeaderValue) -> Option<Duration> {
    let digits = value.as_bytes();
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let millis: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(Duration::from_millis(millis))
}

/// The error for a request body read twice: a handler's mistake, not the client's.
fn already_read() -> ConnectError {
    ConnectError::new(Code::Internal, "the request body was already read")
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

    use axum::http::Request as HttpRequest;
    use futures::stream;

    use super::*;
    use crate::envd::proto::filesystem::{EntryInfo, FileType, StatResponse};
    use crate::envd::proto::process::{
        process_event, process_input, process_selector, stream_input_request, ProcessEvent,
        SendSignalRequest, Signal, StartRequest, StartResponse, StreamInputRequest,
    };

    /// A request with this content type and body.
    fn request(content_type: &str, body: Body) -> Request {
        HttpRequest::builder()
            .method("POST")
            .uri("/process.Process/Start")
            .header(CONTENT_TYPE, content_type)
            .body(body)
            .unwrap()
    }

    /// A body that arrives in these chunks.
    fn chunked(chunks: Vec<Vec<u8>>) -> Body {
        Body::from_stream(stream::iter(chunks.into_iter().map(Ok::<_, Infallible>)))
    }

    /// A call of this content type over this body; panics if the request is refused.
    fn call(content_type: &str, body: Body) -> Call {
        Call::from_request(request(content_type, body))
            .unwrap_or_else(|response| panic!("refused: {}", response.status()))
    }

    /// A response's whole body.
    async fn body_of(response: Response) -> Bytes {
        axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap()
    }

    /// The envelopes of a streamed answer, as (flags, message).
    fn envelopes_of(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut envelopes = Vec::new();
        while !bytes.is_empty() {
            let length = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
            envelopes.push((bytes[0], bytes[5..5 + length].to_vec()));
            bytes = &bytes[5 + length..];
        }
        envelopes
    }

    /// An envelope of a message, as a client sends it.
    fn client_envelope(message: &[u8]) -> Vec<u8> {
        envelope(0, message).unwrap().to_vec()
    }

    /// The JSON of a response body.
    fn json(bytes: &[u8]) -> serde_json::Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn a_call_can_be_held_across_awaits_in_a_send_future() {
        fn send_and_sync<T: Send + Sync>() {}
        send_and_sync::<Call>();
    }

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
    async fn an_oversize_unary_body_is_refused() {
        let mut call = call(
            "application/json",
            chunked(vec![vec![b' '; MAX_MESSAGE_BYTES], vec![b' ']]),
        );
        let error = call.message::<StartRequest>().await.unwrap_err();
        assert_eq!(error.code, Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn a_compressed_envelope_is_refused() {
        let mut compressed = client_envelope(b"\x1f\x8b");
        compressed[0] = FLAG_COMPRESSED;
        let mut call = call("application/connect+json", chunked(vec![compressed]));
        let error = call.message::<StartRequest>().await.unwrap_err();
        assert_eq!(error.code, Code::InvalidArgument);
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
    async fn a_start_request_decodes_exactly_as_the_python_sdk_sends_it() {
        // protobuf-py's `to_json()` of the SDK's `commands.run` request: the empty envs map
        // left out, `stdin` present because it is an `optional` field set to false.
        let sent = br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"cwd":"/home/user"},"stdin":false}"#;
        let mut call = call(
            "application/connect+json",
            chunked(vec![client_envelope(sent)]),
        );
        let request: StartRequest = call.message().await.unwrap();
        let process = request.process.unwrap();
        assert_eq!(process.cmd, "/bin/bash");
        assert_eq!(process.args, ["-l", "-c", "echo hi"]);
        assert!(process.envs.is_empty());
        assert_eq!(process.cwd.as_deref(), Some("/home/user"));
        assert_eq!(request.stdin, Some(false));
        assert_eq!(request.pty, None);
        assert_eq!(request.tag, None);
    }

    #[test]
    fn a_start_request_with_a_terminal_and_an_empty_envs_object_decodes() {
        let sent = br#"{"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{},"cwd":"/home/user"},"pty":{"size":{"cols":80,"rows":24}},"tag":"t"}"#;
        let request: StartRequest = Codec::Json.decode(sent).unwrap();
        let size = request.pty.unwrap().size.unwrap();
        assert_eq!((size.cols, size.rows), (80, 24));
        assert_eq!(request.tag.as_deref(), Some("t"));
        assert_eq!(request.stdin, None);
    }

    #[test]
    fn a_start_request_decodes_from_binary_protobuf() {
        // protobuf-py's `to_binary()` of a request with envs {"A": "b"}, a 80x24 terminal,
        // tag "t" and stdin true.
        let sent = hex::decode(
            "0a240a092f62696e2f6261736812022d6c12022d6312076563686f2068691a060a014112016212060a04085010181a01742001",
        )
        .unwrap();
        let request: StartRequest = Codec::Proto.decode(&sent).unwrap();
        let process = request.process.unwrap();
        assert_eq!(process.args, ["-l", "-c", "echo hi"]);
        assert_eq!(process.envs.get("A").map(String::as_str), Some("b"));
        assert_eq!(process.cwd, None);
        assert_eq!(request.stdin, Some(true));
        assert_eq!(request.pty.unwrap().size.unwrap().cols, 80);
    }

    #[test]
    fn a_signal_decodes_from_its_name_or_its_number() {
        let by_name: SendSignalRequest = Codec::Json
            .decode(br#"{"process":{"pid":42},"signal":"SIGNAL_SIGKILL"}"#)
            .unwrap();
        let by_number: SendSignalRequest = Codec::Json
            .decode(br#"{"process":{"pid":42},"signal":9}"#)
            .unwrap();
        assert_eq!(by_name, by_number);
        assert_eq!(by_name.signal(), Signal::Sigkill);
        assert_eq!(
            by_name.process.unwrap().selector,
            Some(process_selector::Selector::Pid(42))
        );
        let binary: SendSignalRequest = Codec::Proto
            .decode(&hex::decode("0a02082a1009").unwrap())
            .unwrap();
        assert_eq!(binary, by_number);
    }

    #[test]
    fn input_bytes_are_base64_in_json() {
        let sent = br#"{"data":{"input":{"stdin":"aGkK/w=="}}}"#;
        let request: StreamInputRequest = Codec::Json.decode(sent).unwrap();
        let Some(stream_input_request::Event::Data(data)) = request.event else {
            panic!("not a data event: {request:?}");
        };
        assert_eq!(
            data.input.unwrap().input,
            Some(process_input::Input::Stdin(b"hi\n\xff".to_vec()))
        );
    }

    #[test]
    fn unknown_fields_are_ignored_in_json_and_in_binary() {
        let json: SendSignalRequest = Codec::Json
            .decode(br#"{"process":{"pid":1,"future":{"x":[1,2]}},"signal":"SIGNAL_SIGTERM","addedLater":true}"#)
            .unwrap();
        assert_eq!(json.signal(), Signal::Sigterm);
        // Field 15 (varint 1) appended to a binary SendSignalRequest.
        let mut binary = hex::decode("0a02082a1009").unwrap();
        binary.extend_from_slice(&[0x78, 0x01]);
        let binary: SendSignalRequest = Codec::Proto.decode(&binary).unwrap();
        assert_eq!(binary.signal(), Signal::Sigkill);
    }

    #[test]
    fn original_field_names_are_accepted_too() {
        let request: StartRequest = Codec::Json
            .decode(br#"{"process":{"cmd":"ls"},"stdin":true}"#)
            .unwrap();
        assert_eq!(request.stdin, Some(true));
        let entry: EntryInfo = Codec::Json
            .decode(br#"{"symlink_target":"/a","is_symlink":true}"#)
            .unwrap();
        assert_eq!(entry.symlink_target.as_deref(), Some("/a"));
        assert!(entry.is_symlink);
    }

    #[test]
    fn an_entry_encodes_in_proto3_json_with_an_rfc_3339_time() {
        let entry = EntryInfo {
            name: "a.txt".into(),
            r#type: FileType::File.into(),
            path: "/home/user/a.txt".into(),
            size: 12,
            mode: 0o100644,
            permissions: "-rw-r--r--".into(),
            owner: "user".into(),
            group: "user".into(),
            modified_time: Some(pbjson_types::Timestamp {
                seconds: 1_704_164_645,
                nanos: 123_000_000,
            }),
            ..EntryInfo::default()
        };
        let encoded = Codec::Json
            .encode(&StatResponse { entry: Some(entry) })
            .unwrap();
        assert_eq!(
            json(&encoded),
            serde_json::json!({"entry": {
                "name": "a.txt",
                "type": "FILE_TYPE_FILE",
                "path": "/home/user/a.txt",
                "size": "12",
                "mode": 33188,
                "permissions": "-rw-r--r--",
                "owner": "user",
                "group": "user",
                // RFC 3339 with an offset, as pbjson-types writes it; protobuf-es (JS SDK)
                // and protobuf-py (Python SDK) both read it.
                "modifiedTime": "2024-01-02T03:04:05.123+00:00",
            }})
        );
    }

    #[tokio::test]
    async fn a_wrong_content_type_is_answered_415_naming_connects() {
        let response = Call::from_request(request("text/plain", Body::empty()))
            .err()
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(
            response.headers()[ACCEPT_POST],
            HeaderValue::from_static(ACCEPTED_CONTENT_TYPES)
        );
        assert_eq!(json(&body_of(response).await)["code"], "unknown");
    }

    #[test]
    fn content_types_name_their_codec_and_kind() {
        for (content_type, expected) in [
            ("application/json", (Codec::Json, false)),
            ("application/json; charset=utf-8", (Codec::Json, false)),
            ("Application/Proto", (Codec::Proto, false)),
            ("application/connect+json", (Codec::Json, true)),
            ("application/connect+proto", (Codec::Proto, true)),
        ] {
            let call = call(content_type, Body::empty());
            assert_eq!(
                (call.codec(), call.is_streaming()),
                expected,
                "{content_type}"
            );
        }
        for refused in ["application/grpc", "application/json; charset=latin1"] {
            assert!(Call::from_request(request(refused, Body::empty())).is_err());
        }
    }

    #[tokio::test]
    async fn a_unary_method_called_as_a_stream_is_answered_415() {
        let call = call("application/connect+json", Body::empty());
        let response = call.require_streaming(false).unwrap_err();
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(call.require_streaming(true).is_ok());
    }

    #[tokio::test]
    async fn the_timeout_header_is_read_and_a_bad_one_refused() {
        let mut ok = request("application/json", Body::empty());
        ok.headers_mut()
            .insert(TIMEOUT_MS, HeaderValue::from_static("1500"));
        let call = Call::from_request(ok).unwrap_or_else(|_| panic!("refused"));
        assert_eq!(call.timeout(), Some(Duration::from_millis(1500)));

        let mut bad = request("application/json", Body::empty());
        bad.headers_mut()
            .insert(TIMEOUT_MS, HeaderValue::from_static("12345678901"));
        let response = Call::from_request(bad).err().unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn another_protocol_version_is_refused_and_version_1_accepted() {
        let mut one = request("application/json", Body::empty());
        one.headers_mut()
            .insert(PROTOCOL_VERSION, HeaderValue::from_static("1"));
        assert!(Call::from_request(one).is_ok());
        let mut two = request("application/connect+json", Body::empty());
        two.headers_mut()
            .insert(PROTOCOL_VERSION, HeaderValue::from_static("2"));
        let response = Call::from_request(two).err().unwrap();
        // A streaming call's errors travel in its end-of-stream envelope.
        assert_eq!(response.status(), StatusCode::OK);
        let envelopes = envelopes_of(&body_of(response).await);
        assert_eq!(json(&envelopes[0].1)["error"]["code"], "invalid_argument");
    }

    fn gzipped(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[tokio::test]
    async fn a_gzip_unary_body_is_inflated_and_other_compressions_are_unimplemented() {
        let body = gzipped(br#"{"process":{"cmd":"true"}}"#);
        let mut gzip = request("application/json", Body::from(body));
        gzip.headers_mut()
            .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let mut call = Call::from_request(gzip).ok().unwrap();
        let start: crate::envd::proto::process::StartRequest = call.message().await.unwrap();
        assert_eq!(start.process.unwrap().cmd, "true");

        let mut brotli = request("application/json", Body::empty());
        brotli
            .headers_mut()
            .insert(CONTENT_ENCODING, HeaderValue::from_static("br"));
        let response = Call::from_request(brotli).err().unwrap();
        assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
        assert_eq!(response.headers()[ACCEPT_ENCODING], "gzip, identity");
        assert_eq!(json(&body_of(response).await)["code"], "unimplemented");
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

    #[tokio::test]
    async fn a_unary_error_has_connects_status_and_a_json_body() {
        let call = call("application/proto", Body::empty());
        let response = call.error(ConnectError::new(Code::NotFound, "no such file"));
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(
            json(&body_of(response).await),
            serde_json::json!({"code": "not_found", "message": "no such file"})
        );
    }

    #[test]
    fn codes_map_to_the_statuses_of_connects_table() {
        for (code, status) in [
            (Code::Canceled, 499),
            (Code::InvalidArgument, 400),
            (Code::DeadlineExceeded, 504),
            (Code::NotFound, 404),
            (Code::AlreadyExists, 409),
            (Code::PermissionDenied, 403),
            (Code::ResourceExhausted, 429),
            (Code::FailedPrecondition, 400),
            (Code::Unimplemented, 501),
            (Code::Internal, 500),
            (Code::Unavailable, 503),
            (Code::Unauthenticated, 401),
        ] {
            assert_eq!(code.http_status().as_u16(), status, "{code}");
        }
    }

    #[tokio::test]
    async fn a_unary_success_is_the_bare_message() {
        let call = call("application/json", Body::empty());
        let response = call.unary(&SendSignalRequest {
            process: None,
            signal: Signal::Sigterm.into(),
        });
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(
            json(&body_of(response).await),
            serde_json::json!({"signal": "SIGNAL_SIGTERM"})
        );
    }

    /// A start response holding this event.
    fn start_response(event: process_event::Event) -> StartResponse {
        StartResponse {
            event: Some(ProcessEvent { event: Some(event) }),
        }
    }

    #[tokio::test]
    async fn a_stream_answers_one_envelope_per_message_then_end_of_stream() {
        let call = call("application/connect+json", Body::empty());
        let events = stream::iter([
            Ok(start_response(process_event::Event::Start(
                process_event::StartEvent { pid: 7 },
            ))),
            Ok(start_response(process_event::Event::Data(
                process_event::DataEvent {
                    output: Some(process_event::data_event::Output::Stdout(b"hi\n".to_vec())),
                },
            ))),
        ]);
        let response = call.stream(events);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/connect+json");
        let envelopes = envelopes_of(&body_of(response).await);
        assert_eq!(envelopes.len(), 3);
        assert_eq!(envelopes[0].0, 0);
        assert_eq!(
            json(&envelopes[0].1),
            serde_json::json!({"event": {"start": {"pid": 7}}})
        );
        assert_eq!(
            json(&envelopes[1].1),
            serde_json::json!({"event": {"data": {"stdout": "aGkK"}}})
        );
        assert_eq!(envelopes[2], (FLAG_END_STREAM, b"{}".to_vec()));
    }

    #[tokio::test]
    async fn a_stream_stops_at_its_first_error_and_ends_with_it() {
        let call = call("application/connect+proto", Body::empty());
        let events = stream::iter([
            Ok(start_response(process_event::Event::Start(
                process_event::StartEvent { pid: 7 },
            ))),
            Err(ConnectError::new(Code::Internal, "the sandbox went away")),
            Ok(start_response(process_event::Event::Start(
                process_event::StartEvent { pid: 8 },
            ))),
        ]);
        let response = call.stream(events);
        assert_eq!(
            response.headers()[CONTENT_TYPE],
            "application/connect+proto"
        );
        let envelopes = envelopes_of(&body_of(response).await);
        assert_eq!(envelopes.len(), 2);
        let first = <StartResponse as prost::Message>::decode(&envelopes[0].1[..]).unwrap();
        assert_eq!(
            first,
            start_response(process_event::Event::Start(process_event::StartEvent {
                pid: 7
            }))
        );
        assert_eq!(envelopes[1].0, FLAG_END_STREAM);
        assert_eq!(
            json(&envelopes[1].1),
            serde_json::json!({"error": {"code": "internal", "message": "the sandbox went away"}})
        );
    }

    #[tokio::test]
    async fn a_client_stream_yields_its_messages_as_they_arrive() {
        let start = client_envelope(br#"{"start":{"process":{"pid":7}}}"#);
        let data = client_envelope(br#"{"data":{"input":{"stdin":"aGkK"}}}"#);
        let keepalive = client_envelope(br#"{"keepalive":{}}"#);
        let (head, tail) = data.split_at(9);
        let body = chunked(vec![
            start,
            head.to_vec(),
            [tail.to_vec(), keepalive].concat(),
        ]);
        let mut call = call("application/connect+json", body);
        let messages: Vec<_> = call.messages::<StreamInputRequest>().collect().await;
        let messages: Vec<_> = messages.into_iter().map(Result::unwrap).collect();
        assert_eq!(messages.len(), 3);
        assert!(matches!(
            messages[0].event,
            Some(stream_input_request::Event::Start(_))
        ));
        assert!(matches!(
            messages[2].event,
            Some(stream_input_request::Event::Keepalive(_))
        ));
        // The body is read once.
        let again: Vec<_> = call.messages::<StreamInputRequest>().collect().await;
        assert_eq!(again[0].as_ref().unwrap_err().code, Code::Internal);
    }

    #[tokio::test]
    async fn a_client_stream_ends_after_a_message_that_does_not_decode() {
        let body = chunked(vec![
            client_envelope(b"{not json"),
            client_envelope(br#"{"keepalive":{}}"#),
        ]);
        let mut call = call("application/connect+json", body);
        let messages: Vec<_> = call.messages::<StreamInputRequest>().collect().await;
        assert_eq!(messages.len(), 1);
        assert_eq!(
            messages[0].as_ref().unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[tokio::test]
    async fn a_server_stream_request_must_hold_exactly_one_message() {
        let one = client_envelope(br#"{"process":{"cmd":"ls"}}"#);
        let mut two = call("application/connect+json", chunked(vec![one.clone(), one]));
        let error = two.message::<StartRequest>().await.unwrap_err();
        assert_eq!(error.code, Code::InvalidArgument);
        let mut none = call("application/connect+json", Body::empty());
        let error = none.message::<StartRequest>().await.unwrap_err();
        assert_eq!(error.code, Code::InvalidArgument);
    }

    #[tokio::test]
    async fn an_empty_unary_json_body_is_the_empty_message() {
        let mut call = call("application/json", Body::empty());
        let request: SendSignalRequest = call.message().await.unwrap();
        assert_eq!(request, SendSignalRequest::default());
    }

    #[tokio::test]
    async fn a_unary_answer_to_a_client_stream_is_one_envelope_then_end_of_stream() {
        let call = call("application/connect+json", Body::empty());
        let response = call.unary(&SendSignalRequest::default());
        let envelopes = envelopes_of(&body_of(response).await);
        assert_eq!(
            envelopes,
            vec![(0, b"{}".to_vec()), (FLAG_END_STREAM, b"{}".to_vec())]
        );
    }
}
