//! The registry's pure parts: selectors and working directories.

use super::marker::Marker;
use super::*;

fn process(serial: u64, pid: Option<u32>, tag: Option<&str>) -> Arc<Process> {
    let (process, _stopped) = Process::new(
        serial,
        Config {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "sleep 10".into()],
            envs: BTreeMap::new(),
            cwd: None,
        },
        tag.map(str::to_owned),
        Mode::Plain,
        "e2b:test".into(),
    );
    if let Some(pid) = pid {
        process.mark(Marker { pid, keeper: None });
    }
    process
}

#[test]
fn selectors_find_running_processes_by_pid_or_tag() {
    let all = [
        process(1, Some(100), Some("web")),
        process(2, Some(200), None),
        // Still starting: no pid yet, never selected.
        process(3, None, Some("starting")),
    ];
    let found = |selector: Selector| select(all.iter(), &selector).map(|(pid, p)| (pid, p.serial));
    assert_eq!(found(Selector::Pid(100)), Some((100, 1)));
    assert_eq!(found(Selector::Pid(200)), Some((200, 2)));
    assert_eq!(found(Selector::Pid(300)), None);
    assert_eq!(found(Selector::Tag("web".into())), Some((100, 1)));
    assert_eq!(found(Selector::Tag("starting".into())), None);
    assert_eq!(found(Selector::Tag("nope".into())), None);
}

#[test]
fn an_ended_process_is_not_selected_and_the_newest_pid_wins() {
    let old = process(1, Some(100), Some("t"));
    let new = process(2, Some(100), Some("t"));
    let all = [old.clone(), new];
    assert_eq!(
        select(all.iter(), &Selector::Pid(100)).map(|(_, p)| p.serial),
        Some(2)
    );
    all[1].finish(Ending::SandboxEnded);
    assert_eq!(
        select(all.iter(), &Selector::Tag("t".into())).map(|(_, p)| p.serial),
        Some(1)
    );
    old.finish(Ending::Exited(Exit::killed()));
    assert!(select(all.iter(), &Selector::Pid(100)).is_none());
}

#[test]
fn working_directories_resolve_like_envds() {
    assert_eq!(resolve_cwd(None), None);
    assert_eq!(resolve_cwd(Some("")), None);
    assert_eq!(resolve_cwd(Some("~")).as_deref(), Some("/home/user"));
    assert_eq!(
        resolve_cwd(Some("~/a/b")).as_deref(),
        Some("/home/user/a/b")
    );
    assert_eq!(resolve_cwd(Some("src")).as_deref(), Some("/home/user/src"));
    assert_eq!(resolve_cwd(Some("/tmp")).as_deref(), Some("/tmp"));
}

#[test]
fn helper_failures_name_what_failed() {
    let outcome = warren_backend::ExecOutcome {
        exit_code: Some(1),
        stderr: b"stty: /dev/pts/9: No such file\n".to_vec(),
        ..Default::default()
    };
    let error = helper_failed("resizing the PTY", &outcome);
    assert_eq!(
        error.to_string(),
        "resizing the PTY failed: stty: /dev/pts/9: No such file"
    );
    let silent = warren_backend::ExecOutcome {
        signal: Some(9),
        ..Default::default()
    };
    assert_eq!(
        helper_failed("sending input", &silent).to_string(),
        "sending input failed: signal: killed"
    );
}
