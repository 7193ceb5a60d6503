//! Answering a call: one message, a stream of them closed by end-of-stream, or an error,
//! each in the form the call's kind takes.

use axum::body::Body;
use axum::http::header::{HeaderValue, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::Response;
use futures::{Stream, StreamExt};

use super::codec::{Codec, Message};
use super::envelope::{end_of_stream, envelope};
use super::{Call, ConnectError};

impl Call {
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

/// A unary call's error answer: the code's HTTP status and the error as JSON. Connect
/// sends unary errors as JSON whatever the call's codec, so `_codec` does not change it.
pub(crate) fn unary_error(_codec: Codec, error: &ConnectError) -> Response {
    respond(
        error.status.unwrap_or(error.code.http_status()),
        "application/json",
        Body::from(error.to_json().to_string()),
    )
}

/// An answer with a status, a content type and a body.
pub(super) fn respond(status: StatusCode, content_type: &'static str, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use futures::stream;

    use super::*;
    use crate::envd::connect::test_support::{body_of, call, envelopes_of, json};
    use crate::envd::connect::{Code, FLAG_END_STREAM};
    use crate::envd::proto::process::{
        process_event, ProcessEvent, SendSignalRequest, Signal, StartResponse,
    };

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
