//! What a context's driver says: its stdout as bounded lines, each parsed into an event of
//! the execution it answers, with the sandbox's secrets masked in every text (I13).

use std::collections::BTreeMap;

use chrono::Utc;
use futures::stream::BoxStream;
use futures::StreamExt as _;
use warren_backend::OutputStream;
use warren_core::SecretMasker;

use super::{CodeEvent, ExecutionStatus, MAX_EVENT_BYTES};
use crate::processes::OutputEvent;
use crate::ProvisionerError;

/// One line of the driver's output.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct DriverEvent {
    #[serde(default)]
    id: Option<String>,
    pub(super) t: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    ts: Option<i64>,
    #[serde(default)]
    main: Option<bool>,
    #[serde(default)]
    data: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default)]
    count: Option<i64>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    traceback: Option<Vec<String>>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    pub(super) message: Option<String>,
}

/// Splits a process's stdout into lines, bounded.
#[derive(Debug, Default)]
pub(super) struct Lines {
    partial: Vec<u8>,
    /// Keep only lines that begin with this; an empty one keeps every line.
    only: Vec<u8>,
    /// The rest of a line that is not kept is being passed over.
    skipping: bool,
}

impl Lines {
    /// Lines that begin with `prefix` only: the others are passed over as they come, never
    /// held, so a large output of another execution costs this one no memory.
    pub(super) fn only(prefix: impl Into<Vec<u8>>) -> Self {
        Self {
            only: prefix.into(),
            ..Self::default()
        }
    }

    /// The complete lines `bytes` ends; an over-long line is an error.
    pub(super) fn push(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, ()> {
        let mut lines = Vec::new();
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            let ends = piece.ends_with(b"\n");
            if self.skipping {
                self.skipping = !ends;
                continue;
            }
            self.partial.extend_from_slice(piece);
            if self.partial.len() >= self.only.len() && !self.partial.starts_with(&self.only) {
                self.partial.clear();
                self.skipping = !ends;
                continue;
            }
            if self.partial.len() > MAX_EVENT_BYTES {
                self.partial.clear();
                return Err(());
            }
            if ends {
                lines.push(std::mem::take(&mut self.partial));
            }
        }
        Ok(lines)
    }
}

/// Masks the sandbox's secrets in every text an event carries (I13). The driver's output
/// was masked as bytes already; this catches a secret the JSON encoding had escaped.
pub(super) fn mask_event(event: CodeEvent, masker: &SecretMasker) -> CodeEvent {
    if masker.is_empty() {
        return event;
    }
    let mask = |text: String| String::from_utf8_lossy(&masker.mask(text.as_bytes())).into_owned();
    match event {
        CodeEvent::Stdout { text, timestamp } => CodeEvent::Stdout {
            text: mask(text),
            timestamp,
        },
        CodeEvent::Stderr { text, timestamp } => CodeEvent::Stderr {
            text: mask(text),
            timestamp,
        },
        CodeEvent::Error {
            name,
            value,
            traceback,
        } => CodeEvent::Error {
            name: mask(name),
            value: mask(value),
            traceback: traceback.into_iter().map(mask).collect(),
        },
        CodeEvent::Result {
            data,
            is_main_result,
        } => CodeEvent::Result {
            data: data
                .into_iter()
                .map(|(mime, value)| {
                    let value = if mime.starts_with("image/") {
                        value
                    } else {
                        mask_json(value, &mask)
                    };
                    (mime, value)
                })
                .collect(),
            is_main_result,
        },
        other => other,
    }
}

/// `value` with every string in it (keys too) masked.
pub(super) fn mask_json(
    value: serde_json::Value,
    mask: &impl Fn(String) -> String,
) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(text) => Value::String(mask(text)),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| mask_json(v, mask)).collect())
        }
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (mask(k), mask_json(v, mask)))
                .collect(),
        ),
        other => other,
    }
}

/// Whether a driver line says the kernel began to run this request.
pub(super) fn started(request: &str, line: &[u8]) -> bool {
    // Short lines only: a result's data is never parsed twice.
    line.len() < 256
        && serde_json::from_slice::<DriverEvent>(line)
            .is_ok_and(|event| event.t == "started" && event.id.as_deref() == Some(request))
}

/// An execution's event from a driver line, when the line is for it.
pub(super) fn event_for(request: &str, line: &[u8], context: &str) -> Option<CodeEvent> {
    let event: DriverEvent = serde_json::from_slice(line).ok()?;
    if event.id.as_deref() != Some(request) {
        return None;
    }
    let now = || Utc::now().timestamp_nanos_opt().unwrap_or_default();
    Some(match event.t.as_str() {
        "stdout" => CodeEvent::Stdout {
            text: event.text.unwrap_or_default(),
            timestamp: event.ts.unwrap_or_else(now),
        },
        "stderr" => CodeEvent::Stderr {
            text: event.text.unwrap_or_default(),
            timestamp: event.ts.unwrap_or_else(now),
        },
        "result" => CodeEvent::Result {
            data: event.data.unwrap_or_default(),
            is_main_result: event.main.unwrap_or(false),
        },
        "error" => CodeEvent::Error {
            name: event.name.unwrap_or_default(),
            value: event.value.unwrap_or_default(),
            traceback: event.traceback.unwrap_or_default(),
        },
        "restarted" => CodeEvent::Restarted,
        "end" => CodeEvent::End {
            context_id: context.to_owned(),
            execution_count: event.count,
            status: if event.status.as_deref() == Some("ok") {
                ExecutionStatus::Ok
            } else {
                ExecutionStatus::Error
            },
        },
        "bad_request" => CodeEvent::Error {
            name: "BadRequest".to_owned(),
            value: event.message.unwrap_or_default(),
            traceback: Vec::new(),
        },
        _ => return None,
    })
}

pub(super) fn driver_failure(name: &str, value: String, context: &str) -> [CodeEvent; 2] {
    [
        CodeEvent::Error {
            name: name.to_owned(),
            value,
            traceback: Vec::new(),
        },
        CodeEvent::End {
            context_id: context.to_owned(),
            execution_count: None,
            status: ExecutionStatus::Error,
        },
    ]
}

/// The first line of a process's stdout, or why there is none.
pub(super) async fn first_line(
    mut output: BoxStream<'static, OutputEvent>,
) -> Result<Vec<u8>, ProvisionerError> {
    let mut lines = Lines::default();
    let mut stderr = Vec::new();
    while let Some(event) = output.next().await {
        match event {
            OutputEvent::Output(piece) if piece.stream == OutputStream::Stdout => {
                let found = lines.push(&piece.bytes).map_err(|()| {
                    ProvisionerError::CodeInterpreterUnavailable {
                        reason: "the driver's first line is too long".to_owned(),
                    }
                })?;
                if let Some(line) = found.into_iter().next() {
                    return Ok(line);
                }
            }
            OutputEvent::Output(piece) => {
                if stderr.len() < 4096 {
                    stderr.extend_from_slice(&piece.bytes);
                }
            }
            OutputEvent::Lost { .. } => {}
            OutputEvent::End(_) => break,
        }
    }
    let said = String::from_utf8_lossy(&stderr);
    let said = said.trim();
    Err(ProvisionerError::CodeInterpreterUnavailable {
        reason: if said.is_empty() {
            "the driver ended before it was ready".to_owned()
        } else {
            format!("the driver ended before it was ready: {said}")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_pieces_come_whole_and_an_over_long_line_is_refused() {
        let mut lines = Lines::default();
        assert!(lines.push(b"{\"a\":").unwrap().is_empty());
        assert_eq!(
            lines.push(b"1}\n{\"b\":2}\n{").unwrap(),
            vec![b"{\"a\":1}\n".to_vec(), b"{\"b\":2}\n".to_vec()]
        );
        // Another execution's lines are passed over, however long, and never held.
        let mut mine = Lines::only(&b"{\"id\":\"r1\","[..]);
        let huge = vec![b'x'; MAX_EVENT_BYTES + 10];
        assert_eq!(
            mine.push(b"{\"id\":\"r2\",\"t\":\"stdout\",\"text\":\"")
                .unwrap()
                .len(),
            0
        );
        for _ in 0..3 {
            assert!(
                mine.push(&huge).unwrap().is_empty(),
                "not held, not refused"
            );
        }
        assert!(mine.partial.is_empty());
        assert_eq!(
            mine.push(b"\"}\n{\"id\":\"r1\",\"t\":\"end\"}\n{\"id\":\"r2\"}\n")
                .unwrap(),
            vec![b"{\"id\":\"r1\",\"t\":\"end\"}\n".to_vec()]
        );
        let mut long = Lines::default();
        let chunk = vec![b'x'; 1 << 20];
        let mut refused = false;
        for _ in 0..=(MAX_EVENT_BYTES >> 20) {
            if long.push(&chunk).is_err() {
                refused = true;
            }
        }
        assert!(refused, "a line over the bound is refused");
    }

    #[test]
    fn only_the_execution_s_own_events_are_taken() {
        let line = br#"{"id":"r1","t":"stdout","text":"hi\n","ts":5}"#;
        assert_eq!(
            event_for("r1", line, "default"),
            Some(CodeEvent::Stdout {
                text: "hi\n".into(),
                timestamp: 5
            })
        );
        assert_eq!(event_for("r2", line, "default"), None);
        let end = br#"{"id":"r1","t":"end","status":"error","count":4}"#;
        assert_eq!(
            event_for("r1", end, "c"),
            Some(CodeEvent::End {
                context_id: "c".into(),
                execution_count: Some(4),
                status: ExecutionStatus::Error
            })
        );
        assert_eq!(event_for("r1", b"not json", "c"), None);
    }

    #[test]
    fn secrets_are_masked_in_every_text_of_an_event_but_not_in_images() {
        let masker = SecretMasker::new([("TOKEN", "s3cr\"t")]);
        let error = mask_event(
            CodeEvent::Error {
                name: "E".into(),
                value: "got s3cr\"t".into(),
                traceback: vec!["line s3cr\"t".into()],
            },
            &masker,
        );
        let CodeEvent::Error {
            value, traceback, ..
        } = error
        else {
            panic!("an error stays an error");
        };
        assert_eq!(value, "got [masked:TOKEN]");
        assert_eq!(traceback, vec!["line [masked:TOKEN]".to_owned()]);
        let result = mask_event(
            CodeEvent::Result {
                data: BTreeMap::from([
                    ("text/plain".into(), serde_json::json!("'s3cr\"t'")),
                    (
                        "application/json".into(),
                        serde_json::json!({"k": "s3cr\"t"}),
                    ),
                    ("image/png".into(), serde_json::json!("s3cr\"t")),
                ]),
                is_main_result: true,
            },
            &masker,
        );
        let CodeEvent::Result { data, .. } = result else {
            panic!("a result stays a result");
        };
        assert_eq!(data["text/plain"], "'[masked:TOKEN]'");
        assert!(!data["application/json"].to_string().contains("s3cr"));
        assert_eq!(data["image/png"], "s3cr\"t", "image bytes are not text");
    }
}
