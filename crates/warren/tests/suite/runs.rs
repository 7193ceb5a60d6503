//! `GET /v1/sandboxes/{id}/runs` and `GET /v1/users/{uid}/runs`: the run records of real
//! commands (I22), read back newest first, filtered and paged.

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use warren_test_support::TestServer;

/// One page of a listing: its status and body.
async fn list(server: &TestServer, path: &str, query: &[(&str, &str)]) -> (u16, Value) {
    server
        .send_json(server.request(Method::GET, path).query(query))
        .await
}

/// Every run of a listing, page by page with `limit`; the ids and how many pages.
async fn every_page(server: &TestServer, path: &str, limit: &str) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut token: Option<String> = None;
    for pages in 1..100 {
        let mut query = vec![("limit", limit)];
        if let Some(token) = token.as_deref() {
            query.push(("page_token", token));
        }
        let (status, body) = list(server, path, &query).await;
        assert_eq!(status, 200, "{body}");
        for run in body["runs"].as_array().unwrap() {
            ids.push(run["id"].as_str().unwrap().to_owned());
        }
        match body["next_page_token"].as_str() {
            Some(next) => token = Some(next.to_owned()),
            None => {
                assert!(body["next_page_token"].is_null(), "{body}");
                return (ids, pages);
            }
        }
    }
    panic!("the pages of {path} never end");
}

fn ids(body: &Value) -> Vec<&str> {
    body["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["id"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn the_runs_of_real_commands_are_listed_newest_first_filtered_and_paged() {
    let server = super::runtime::local();
    let one = server.sandbox("alice", "t-1", "projects/a").await;
    let two = server.sandbox("alice", "t-2", "projects/b").await;
    let bobs = server.sandbox("bob", "t-1", "projects/a").await;

    let ok = server.exec(&one, "echo hello").await;
    let three = server.exec(&two, "exit 3").await;
    // Runs started later than everything above, by a clear margin.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let timed_out = server
        .exec_with(
            &one,
            serde_json::json!({"argv": ["sleep", "30"], "timeout_s": 1}),
        )
        .await;
    let bob = server.exec(&bobs, "true").await;
    let run_id = |result: &Value| result["run_id"].as_str().unwrap().to_owned();
    let (ok, three, timed_out, bob) = (
        run_id(&ok),
        run_id(&three),
        run_id(&timed_out),
        run_id(&bob),
    );

    // The sandbox's runs, newest first, with what each command did.
    let (status, body) = list(&server, &format!("/v1/sandboxes/{one}/runs"), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids(&body), [timed_out.as_str(), ok.as_str()], "{body}");
    assert!(body["next_page_token"].is_null(), "{body}");
    let last = &body["runs"][0];
    assert_eq!(last["sandbox_id"], one.as_str());
    assert_eq!(last["generation"], 1);
    assert_eq!(last["kind"], "exec");
    assert_eq!(last["tag"], Value::Null);
    assert_eq!(last["pty"], false);
    assert_eq!(last["status"], "finished");
    assert_eq!(last["timed_out"], true, "{last}");
    assert_eq!(last["exit_code"], Value::Null, "{last}");
    assert_eq!(last["signal"], 9, "{last}");
    assert_eq!(last["failure_reason"], Value::Null);
    assert!(
        last["command"].as_str().unwrap().contains("sleep"),
        "{last}"
    );
    let first = &body["runs"][1];
    assert_eq!(first["status"], "finished");
    assert_eq!(first["exit_code"], 0, "{first}");
    assert_eq!(first["signal"], Value::Null);
    assert_eq!(first["timed_out"], false);
    assert_eq!(first["cwd"], "/home/gem/user-data/projects/a", "{first}");
    assert_eq!(first["requested_by"], "api", "{first}");
    assert!(
        first["command"].as_str().unwrap().contains("echo hello"),
        "{first}"
    );
    assert!(first["duration_ms"].is_u64(), "{first}");
    assert!(first["finished_at"].is_string(), "{first}");
    // Virtual paths only (I1).
    let host = server.data_dir();
    assert!(!body.to_string().contains(host.to_str().unwrap()), "{body}");

    // Every sandbox of the uid, and never another uid's.
    let alice = "/v1/users/alice/runs";
    let (status, body) = list(&server, alice, &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        ids(&body),
        [timed_out.as_str(), three.as_str(), ok.as_str()],
        "{body}"
    );
    assert_eq!(body["runs"][1]["exit_code"], 3, "{body}");
    let (_, body) = list(&server, "/v1/users/bob/runs", &[]).await;
    assert_eq!(ids(&body), [bob.as_str()], "{body}");
    let (status, body) = list(&server, "/v1/users/carol/runs", &[]).await;
    assert_eq!((status, ids(&body).len()), (200, 0), "{body}");

    // Pages of one, through all of them: nothing lost or repeated.
    let (paged, pages) = every_page(&server, alice, "1").await;
    assert_eq!(paged, [timed_out.clone(), three.clone(), ok.clone()]);
    assert_eq!(pages, 3);
    let (paged, pages) = every_page(&server, &format!("/v1/sandboxes/{one}/runs"), "1").await;
    assert_eq!((paged, pages), (vec![timed_out.clone(), ok.clone()], 2));

    // Filters.
    let (_, body) = list(&server, alice, &[("status", "running")]).await;
    assert_eq!(ids(&body).len(), 0, "{body}");
    let (_, body) = list(&server, alice, &[("status", "finished"), ("limit", "2")]).await;
    assert_eq!(ids(&body), [timed_out.as_str(), three.as_str()], "{body}");
    assert!(body["next_page_token"].is_string(), "{body}");
    // `since` an answered start time includes that run and what followed.
    let (_, all) = list(&server, alice, &[]).await;
    let since = all["runs"][0]["started_at"].as_str().unwrap().to_owned();
    let (status, body) = list(&server, alice, &[("since", since.as_str())]).await;
    assert_eq!(
        (status, ids(&body)),
        (200, vec![timed_out.as_str()]),
        "{body}"
    );
    let (_, body) = list(&server, alice, &[("since", "2000-01-01T00:00:00+02:00")]).await;
    assert_eq!(ids(&body).len(), 3, "{body}");
    let (_, body) = list(&server, alice, &[("since", "2999-01-01T00:00:00Z")]).await;
    assert_eq!(ids(&body).len(), 0, "{body}");
}

#[tokio::test]
async fn a_command_still_running_is_listed_as_running_until_it_ends() {
    let server = super::runtime::local();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let exec = server
        .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .json(&serde_json::json!({"argv": ["sleep", "30"], "timeout_s": 3}))
        .send();
    let exec = tokio::spawn(exec);
    let path = format!("/v1/sandboxes/{id}/runs");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let running = loop {
        let (_, body) = list(&server, &path, &[("status", "running")]).await;
        if let Some(run) = body["runs"].as_array().and_then(|runs| runs.first()) {
            break run.clone();
        }
        assert!(std::time::Instant::now() < deadline, "the run never showed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(running["status"], "running", "{running}");
    assert_eq!(running["finished_at"], Value::Null, "{running}");
    assert_eq!(running["exit_code"], Value::Null, "{running}");
    assert_eq!(running["duration_ms"], Value::Null, "{running}");

    let answer: Value = exec.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(answer["run_id"], running["id"], "{answer}");
    let (_, body) = list(&server, &path, &[("status", "running")]).await;
    assert_eq!(ids(&body).len(), 0, "{body}");
    let (_, body) = list(&server, &path, &[("status", "finished")]).await;
    assert_eq!(ids(&body), [running["id"].as_str().unwrap()], "{body}");
    let finished = &body["runs"][0];
    assert_eq!(
        (&finished["timed_out"], &finished["signal"]),
        (&Value::Bool(true), &serde_json::json!(9)),
        "{finished}"
    );
    assert_eq!(finished["started_at"], running["started_at"]);
}

#[tokio::test]
async fn a_malformed_listing_is_refused_with_its_code_and_an_unknown_sandbox_is_404() {
    let server = super::server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    let path = format!("/v1/sandboxes/{id}/runs");
    for (path, query, code) in [
        (
            path.as_str(),
            ("page_token", "not-a-token"),
            "invalid_page_token",
        ),
        (
            "/v1/users/alice/runs",
            ("page_token", "%%%"),
            "invalid_page_token",
        ),
        (path.as_str(), ("limit", "0"), "invalid_query"),
        (path.as_str(), ("limit", "501"), "invalid_query"),
        (path.as_str(), ("status", "done"), "invalid_query"),
        (path.as_str(), ("since", "yesterday"), "invalid_query"),
    ] {
        let (status, body) = list(&server, path, &[query]).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some(code)),
            "{path} {query:?}: {body}"
        );
    }
    let (status, body) = list(&server, &path, &[("limit", "500")]).await;
    assert_eq!(status, 200, "{body}");

    let (status, body) = list(
        &server,
        "/v1/sandboxes/sbx-000000000000000000000000/runs",
        &[],
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("sandbox_not_found")),
        "{body}"
    );
    let (status, body) = list(&server, "/v1/sandboxes/nope/runs", &[]).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_sandbox_id")),
        "{body}"
    );
    let (status, body) = list(&server, "/v1/users/session:x/runs", &[]).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("reserved_uid")),
        "{body}"
    );
    let (status, _) = server
        .send_json(server.anonymous(Method::GET, "/v1/users/alice/runs"))
        .await;
    assert_eq!(status, 401);
}
