//! The file surfaces end to end over a real provisioner (SQLite in memory, the memory
//! backend, a workspace in a temporary directory): Connect calls and `/files` requests
//! built as the SDKs send them, answered by the handlers themselves.

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};

use crate::envd::connect::Call;
use crate::envd::fixture::Fixture;
use crate::envd::{files, filesystem};

const SANDBOX: &str = "smoke000000000000001";

async fn fixture() -> Fixture {
    crate::envd::fixture::fixture(SANDBOX).await
}

/// A unary Connect call with a JSON body; the status and the JSON answer.
async fn rpc(fixture: &Fixture, method: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::post(format!("/filesystem.Filesystem/{method}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let call = Call::from_request(request).unwrap();
    let response = filesystem::serve(fixture.ctx.clone(), method, call).await;
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn headers(fixture: &Fixture) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("e2b-sandbox-id", SANDBOX.parse().unwrap());
    let token = fixture.ctx.shared.secrets.access_token(SANDBOX);
    headers.insert("x-access-token", token.parse().unwrap());
    headers
}

fn query(pairs: &[(&str, &str)]) -> Query<files::FilesQuery> {
    let text: String = pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", v.replace('+', "%2B").replace('/', "%2F")))
        .collect::<Vec<_>>()
        .join("&");
    Query(serde_urlencoded_from(&text))
}

fn serde_urlencoded_from(text: &str) -> files::FilesQuery {
    let uri: axum::http::Uri = format!("/files?{text}").parse().unwrap();
    Query::<files::FilesQuery>::try_from_uri(&uri).unwrap().0
}

async fn upload(
    fixture: &Fixture,
    pairs: &[(&str, &str)],
    headers: HeaderMap,
    content_type: &str,
    body: impl Into<Body>,
) -> (StatusCode, Value) {
    let mut request = Request::post("/files")
        .header("content-type", content_type)
        .body(body.into())
        .unwrap();
    *request.headers_mut() = {
        let mut all = headers;
        all.insert("content-type", content_type.parse().unwrap());
        all
    };
    let response =
        files::upload(State(fixture.ctx.shared.clone()), Ok(query(pairs)), request).await;
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn download(
    fixture: &Fixture,
    pairs: &[(&str, &str)],
    headers: HeaderMap,
) -> (StatusCode, Vec<u8>) {
    let response =
        files::download(State(fixture.ctx.shared.clone()), Ok(query(pairs)), headers).await;
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, bytes.to_vec())
}

const FORM: &str = "multipart/form-data; boundary=XyZ";

fn form(parts: &[(&str, &str)]) -> String {
    let mut body = String::new();
    for (name, content) in parts {
        body.push_str(&format!(
            "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\r\n{content}\r\n"
        ));
    }
    body.push_str("--XyZ--\r\n");
    body
}

#[tokio::test]
async fn files_written_by_upload_are_stated_listed_moved_read_and_removed() {
    let fixture = fixture().await;
    let (status, written) = upload(
        &fixture,
        &[],
        headers(&fixture),
        FORM,
        form(&[("a.txt", "hello"), ("/home/user/dir/b.txt", "bee")]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{written}");
    assert_eq!(
        written,
        json!([
            {"name": "a.txt", "type": "file", "path": "/home/user/a.txt"},
            {"name": "b.txt", "type": "file", "path": "/home/user/dir/b.txt"}
        ])
    );

    let (status, stat) = rpc(&fixture, "Stat", json!({"path": "a.txt"})).await;
    assert_eq!(status, StatusCode::OK, "{stat}");
    let entry = &stat["entry"];
    assert_eq!(entry["name"], "a.txt");
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["path"], "/home/user/a.txt");
    assert_eq!(entry["size"], "5");
    assert_eq!(entry["permissions"], "-rw-r--r--");

    let (status, listed) = rpc(
        &fixture,
        "ListDir",
        json!({"path": "/home/user", "depth": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["/home/user/a.txt", "/home/user/dir", "/home/user/dir/b.txt"]
    );

    let (status, made) = rpc(&fixture, "MakeDir", json!({"path": "~/new"})).await;
    assert_eq!(status, StatusCode::OK, "{made}");
    let (status, again) = rpc(&fixture, "MakeDir", json!({"path": "new"})).await;
    assert_eq!(
        (status, again["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_exists"))
    );

    let (status, moved) = rpc(
        &fixture,
        "Move",
        json!({"source": "a.txt", "destination": "/home/user/deep/er/a.txt"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{moved}");
    assert_eq!(moved["entry"]["path"], "/home/user/deep/er/a.txt");

    let (status, bytes) = download(
        &fixture,
        &[("path", "/home/user/deep/er/a.txt")],
        headers(&fixture),
    )
    .await;
    assert_eq!((status, bytes.as_slice()), (StatusCode::OK, &b"hello"[..]));

    let (status, _) = rpc(&fixture, "Remove", json!({"path": "dir"})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = rpc(&fixture, "Remove", json!({"path": "dir"})).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "removing what is gone succeeds, as os.RemoveAll"
    );
    let (status, gone) = rpc(&fixture, "Stat", json!({"path": "dir/b.txt"})).await;
    assert_eq!(
        (status, gone["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, _) = download(&fixture, &[("path", "dir/b.txt")], headers(&fixture)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn paths_outside_the_home_are_refused_with_virtual_paths_only() {
    let fixture = fixture().await;
    for path in ["../x", "/home/user/../../etc"] {
        let (status, refused) = rpc(&fixture, "Stat", json!({"path": path})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {refused}");
        assert_eq!(refused["code"], "invalid_argument");
        let message = refused["message"].as_str().unwrap();
        assert!(
            !message.contains(fixture.data_dir.to_str().unwrap()),
            "{message}"
        );
    }
    // An absolute path outside the home is the runtime's own (issue 42), which only a
    // runtime's agent serves: this backend runs none, and says so.
    let (status, refused) = rpc(&fixture, "Stat", json!({"path": "/etc/passwd"})).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (StatusCode::NOT_IMPLEMENTED, Some("unimplemented")),
        "{refused}"
    );
    let (status, refused) = rpc(&fixture, "Remove", json!({"path": "/home/user"})).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("permission_denied"))
    );
}

#[tokio::test]
async fn files_requests_need_the_token_or_a_signature() {
    let fixture = fixture().await;
    let mut anonymous = HeaderMap::new();
    anonymous.insert("e2b-sandbox-id", SANDBOX.parse().unwrap());
    let (status, _) = upload(
        &fixture,
        &[("path", "f")],
        anonymous.clone(),
        "application/octet-stream",
        "x",
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let token = fixture.ctx.shared.secrets.access_token(SANDBOX);
    let sign = |op| super::signature::sign("f", op, "", &token, None);
    let write = sign(super::signature::Operation::Write);
    let (status, body) = upload(
        &fixture,
        &[("path", "f"), ("signature", &write)],
        anonymous.clone(),
        "application/octet-stream",
        "signed",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A write signature does not read.
    let (status, _) = download(&fixture, &[("path", "f"), ("signature", &write)], anonymous).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A URL naming no sandbox is matched by its signature among the live sandboxes.
    let read = sign(super::signature::Operation::Read);
    let (status, bytes) = download(
        &fixture,
        &[("path", "f"), ("signature", &read)],
        HeaderMap::new(),
    )
    .await;
    assert_eq!((status, bytes.as_slice()), (StatusCode::OK, &b"signed"[..]));
    let (status, _) = download(
        &fixture,
        &[
            ("path", "f"),
            ("signature", &read),
            ("signature_expiration", "1"),
        ],
        HeaderMap::new(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_watcher_reports_what_changed_before_each_poll() {
    let fixture = fixture().await;
    rpc(&fixture, "MakeDir", json!({"path": "w"})).await;
    let (status, created) = rpc(&fixture, "CreateWatcher", json!({"path": "w"})).await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let id = created["watcherId"].as_str().unwrap().to_owned();

    upload(
        &fixture,
        &[("path", "w/f.txt")],
        headers(&fixture),
        "application/octet-stream",
        "data",
    )
    .await;
    let (status, polled) = rpc(&fixture, "GetWatcherEvents", json!({"watcherId": id})).await;
    assert_eq!(status, StatusCode::OK, "{polled}");
    assert_eq!(
        polled["events"],
        json!([
            {"name": "f.txt", "type": "EVENT_TYPE_CREATE"},
            {"name": "f.txt", "type": "EVENT_TYPE_CHMOD"},
            {"name": "f.txt", "type": "EVENT_TYPE_WRITE"}
        ])
    );
    rpc(&fixture, "Remove", json!({"path": "w/f.txt"})).await;
    let (_, polled) = rpc(&fixture, "GetWatcherEvents", json!({"watcherId": id})).await;
    assert_eq!(
        polled["events"],
        json!([{"name": "f.txt", "type": "EVENT_TYPE_REMOVE"}])
    );

    let (status, _) = rpc(&fixture, "RemoveWatcher", json!({"watcherId": id})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, gone) = rpc(&fixture, "GetWatcherEvents", json!({"watcherId": id})).await;
    assert_eq!(
        (status, gone["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
}

/// Reads one Connect envelope's JSON from a streaming answer.
async fn next_envelope(
    body: &mut (impl futures::Stream<Item = Result<bytes::Bytes, axum::Error>> + Unpin),
    buffer: &mut Vec<u8>,
) -> Value {
    use futures::StreamExt as _;
    loop {
        if buffer.len() >= 5 {
            let length = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
            if buffer.len() >= 5 + length {
                let message: Vec<u8> = buffer.drain(..5 + length).skip(5).collect();
                return serde_json::from_slice(&message).unwrap();
            }
        }
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(5), body.next())
            .await
            .expect("an envelope within 5 s")
            .expect("the stream goes on")
            .unwrap();
        buffer.extend_from_slice(&chunk);
    }
}

#[tokio::test]
async fn a_watch_stream_starts_then_reports_changes_recursively() {
    let fixture = fixture().await;
    rpc(&fixture, "MakeDir", json!({"path": "s/sub"})).await;
    let message = json!({"path": "/home/user/s", "recursive": true}).to_string();
    let mut envelope = vec![0];
    envelope.extend_from_slice(&(message.len() as u32).to_be_bytes());
    envelope.extend_from_slice(message.as_bytes());
    let request = Request::post("/filesystem.Filesystem/WatchDir")
        .header("content-type", "application/connect+json")
        .body(Body::from(envelope))
        .unwrap();
    let call = Call::from_request(request).unwrap();
    let response = filesystem::serve(fixture.ctx.clone(), "WatchDir", call).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body().into_data_stream();
    let mut buffer = Vec::new();
    assert_eq!(
        next_envelope(&mut body, &mut buffer).await,
        json!({"start": {}})
    );

    upload(
        &fixture,
        &[("path", "s/sub/deep.txt")],
        headers(&fixture),
        "application/octet-stream",
        "x",
    )
    .await;
    assert_eq!(
        next_envelope(&mut body, &mut buffer).await,
        json!({"filesystem": {"name": "sub/deep.txt", "type": "EVENT_TYPE_CREATE"}})
    );
    assert_eq!(
        next_envelope(&mut body, &mut buffer).await,
        json!({"filesystem": {"name": "sub/deep.txt", "type": "EVENT_TYPE_CHMOD"}})
    );
    assert_eq!(
        next_envelope(&mut body, &mut buffer).await,
        json!({"filesystem": {"name": "sub/deep.txt", "type": "EVENT_TYPE_WRITE"}})
    );
}
