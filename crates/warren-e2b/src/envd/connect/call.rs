//! One incoming call: its content type, Connect headers and timeout checked, and its
//! request message or messages read from the body.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{
    HeaderName, HeaderValue, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE,
};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::Stream;

use super::answer::respond;
use super::codec::{parse_content_type, Codec, Message};
use super::envelope::{drain_body, inflate, read_bounded, EnvelopeReader};
use super::{
    Code, ConnectError, ACCEPTED_CONTENT_TYPES, ACCEPT_POST, MAX_MESSAGE_BYTES, PROTOCOL_VERSION,
    STREAM_ACCEPT_ENCODING, STREAM_CONTENT_ENCODING, TIMEOUT_MS,
};

/// One incoming call.
pub(crate) struct Call {
    headers: HeaderMap,
    pub(super) codec: Codec,
    pub(super) streaming: bool,
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

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::envd::connect::test_support::{
        body_of, call, chunked, client_envelope, envelopes_of, gzipped, json, request,
    };
    use crate::envd::connect::FLAG_COMPRESSED;
    use crate::envd::proto::process::{
        stream_input_request, SendSignalRequest, StartRequest, StreamInputRequest,
    };

    #[test]
    fn a_call_can_be_held_across_awaits_in_a_send_future() {
        fn send_and_sync<T: Send + Sync>() {}
        send_and_sync::<Call>();
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
}
