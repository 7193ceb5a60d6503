//! The two codecs of envd's messages (proto3 JSON and binary protobuf) and the content
//! types that name them.

use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;

use super::{Code, ConnectError};

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
    pub(super) fn content_type(self, streaming: bool) -> &'static str {
        match (self, streaming) {
            (Self::Json, false) => "application/json",
            (Self::Proto, false) => "application/proto",
            (Self::Json, true) => "application/connect+json",
            (Self::Proto, true) => "application/connect+proto",
        }
    }

    /// A message's bytes in this codec.
    pub(super) fn encode<T: Message>(self, message: &T) -> Result<Vec<u8>, ConnectError> {
        match self {
            Self::Json => serde_json::to_vec(message).map_err(|error| {
                ConnectError::new(Code::Internal, format!("encoding the answer: {error}"))
            }),
            Self::Proto => Ok(message.encode_to_vec()),
        }
    }

    /// A message from its bytes in this codec. An empty JSON body is taken as the empty
    /// message, as an empty protobuf body is.
    pub(super) fn decode<T: Message>(self, bytes: &[u8]) -> Result<T, ConnectError> {
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

/// The codec and kind (streaming or not) a request's content type names; `None` for one
/// Connect does not define. A `charset=utf-8` parameter is allowed (browsers add it).
pub(super) fn parse_content_type(headers: &HeaderMap) -> Option<(Codec, bool)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envd::connect::test_support::{call, chunked, client_envelope, json};
    use crate::envd::proto::filesystem::{EntryInfo, FileType, StatResponse};
    use crate::envd::proto::process::{
        process_input, process_selector, stream_input_request, SendSignalRequest, Signal,
        StartRequest, StreamInputRequest,
    };

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
}
