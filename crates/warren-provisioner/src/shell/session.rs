//! One session: its state, the command it runs, and what the shell writes about it.

use super::*;

/// One session.
pub(super) struct Session {
    pub(super) id: String,
    pub(super) kind: SessionKind,
    /// Made for a command that named no session: the first to go when room is needed.
    pub(super) implicit: bool,
    pub(super) sandbox: SandboxId,
    /// The runtime generation its shell runs in.
    pub(super) generation: i64,
    pub(super) created_at: DateTime<Utc>,
    /// Where the shell starts: its prelude changes there.
    pub(super) start_dir: String,
    pub(super) masker: SecretMasker,
    /// Which shell it got, once the shell said it is ready.
    pub(super) flavor: OnceLock<Flavor>,
    /// The shell's stdin, its script: one writer at a time.
    pub(super) stdin: tokio::sync::Mutex<Option<ProcessInput>>,
    /// Kills of the shell's commands and of the shell.
    pub(super) control: OnceLock<ProcessControl>,
    pub(super) state: Mutex<State>,
    /// Bumped on every change of `state`, for whoever waits.
    pub(super) changed: watch::Sender<u64>,
    /// Serialises commands.
    pub(super) submit: tokio::sync::Mutex<()>,
}

pub(super) struct State {
    pub(super) cwd: String,
    pub(super) last_used: Instant,
    pub(super) last_used_at: DateTime<Utc>,
    pub(super) no_change_timeout: Duration,
    pub(super) command_count: u64,
    /// Set once the shell has ended: its exit status, and when.
    pub(super) ended: Option<(Option<i32>, Instant)>,
    /// The latest command, running or not.
    pub(super) current: Option<Command>,
    pub(super) stdout: Scan,
    pub(super) stderr: Scan,
    /// Closing the session: the driver kills the shell and its tree.
    pub(super) close: Option<oneshot::Sender<()>>,
}

pub(super) struct Command {
    pub(super) id: String,
    pub(super) text: String,
    pub(super) nonce: String,
    pub(super) run_id: String,
    pub(super) started: Instant,
    /// When the command began: the runtime's clock (hundredths of a second since boot)
    /// and the last pid it had handed out.
    pub(super) begin_mark: Option<BeginMark>,
    pub(super) begun: bool,
    /// stdout (everything, for a shell session) and stderr.
    pub(super) output: [Capture; 2],
    pub(super) last_output: tokio::time::Instant,
    pub(super) no_change_override: Option<Duration>,
    pub(super) stop: Option<Stop>,
    pub(super) exit_code: Option<i32>,
    /// End markers seen, per stream.
    pub(super) ends_seen: [bool; 2],
    pub(super) finished: Option<CommandStatus>,
    pub(super) busy: Option<InflightHold>,
}

impl Command {
    pub(super) fn running(&self) -> bool {
        self.finished.is_none()
    }
}

/// How a command's end came about.
pub(super) enum Finish {
    /// Its end markers arrived.
    Marked,
    /// The shell ended under it, with this exit status.
    ShellEnded(Option<i32>),
    /// It never reached the shell.
    Undelivered,
}

impl Session {
    pub(super) fn new(
        id: String,
        kind: SessionKind,
        implicit: bool,
        record: &SandboxRecord,
        cwd: String,
        no_change_timeout: Duration,
        masker: SecretMasker,
    ) -> Self {
        Self {
            id,
            kind,
            implicit,
            sandbox: record.id.clone(),
            generation: record.generation,
            created_at: Utc::now(),
            start_dir: cwd.clone(),
            masker,
            flavor: OnceLock::new(),
            stdin: tokio::sync::Mutex::new(None),
            control: OnceLock::new(),
            state: Mutex::new(State {
                cwd,
                last_used: Instant::now(),
                last_used_at: Utc::now(),
                no_change_timeout,
                command_count: 0,
                ended: None,
                current: None,
                stdout: Scan::default(),
                stderr: Scan::default(),
                close: None,
            }),
            changed: watch::channel(0).0,
            submit: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn notify(&self) {
        self.changed.send_modify(|version| *version += 1);
    }

    pub(super) fn ended(&self) -> bool {
        self.lock().ended.is_some()
    }

    pub(super) fn check_can_run(&self) -> Result<(), ProvisionerError> {
        let state = self.lock();
        if state.ended.is_some() {
            return Err(ProvisionerError::ShellSessionNotFound {
                id: self.id.clone(),
            });
        }
        if let Some(command) = state.current.as_ref().filter(|c| c.running()) {
            return Err(ProvisionerError::ShellSessionBusy {
                id: self.id.clone(),
                command: command.text.chars().take(200).collect(),
            });
        }
        Ok(())
    }

    /// Makes `command` the session's current one; false when the shell has ended.
    pub(super) fn begin_command(&self, command: Command) -> bool {
        {
            let mut state = self.lock();
            if state.ended.is_some() {
                return false;
            }
            state.command_count += 1;
            state.last_used = Instant::now();
            state.last_used_at = Utc::now();
            state.stdout.expect();
            state.stderr.expect();
            state.current = Some(command);
        }
        self.notify();
        true
    }

    pub(super) fn info(&self) -> SessionInfo {
        let state = self.lock();
        let running = state.current.as_ref().filter(|c| c.running());
        SessionInfo {
            id: self.id.clone(),
            kind: self.kind,
            working_dir: state.cwd.clone(),
            created_at: self.created_at,
            last_used_at: state.last_used_at,
            status: if state.ended.is_some() {
                SessionStatus::Ended
            } else if running.is_some() {
                SessionStatus::Busy
            } else {
                SessionStatus::Ready
            },
            current_command: running.map(|c| c.text.clone()),
            command_count: state.command_count,
            no_change_timeout: state.no_change_timeout,
        }
    }

    pub(super) fn latest_report(&self, status: Option<CommandStatus>) -> CommandReport {
        let state = self.lock();
        self.report_of(&state, status)
    }

    pub(super) fn report_of(&self, state: &State, status: Option<CommandStatus>) -> CommandReport {
        let session_ended = state.ended.is_some();
        let Some(command) = &state.current else {
            return CommandReport {
                session_id: self.id.clone(),
                command_id: String::new(),
                command: String::new(),
                status: if session_ended {
                    CommandStatus::Terminated
                } else {
                    CommandStatus::Completed
                },
                exit_code: state.ended.and_then(|(code, _)| code),
                stdout: String::new(),
                stderr: String::new(),
                truncated: false,
                run_id: String::new(),
                session_ended,
            };
        };
        let [stdout, stderr] = &command.output;
        CommandReport {
            session_id: self.id.clone(),
            command_id: command.id.clone(),
            command: command.text.clone(),
            status: status
                .filter(|_| command.running())
                .or(command.finished)
                .unwrap_or(CommandStatus::Running),
            exit_code: command.exit_code,
            stdout: stdout.text(),
            stderr: stderr.text(),
            truncated: stdout.truncated() || stderr.truncated(),
            run_id: command.run_id.clone(),
            session_ended,
        }
    }

    /// Waits for the command `id` as [`CommandWait::Until`] describes.
    pub(super) async fn await_command(&self, id: &str, limit: Option<Duration>) -> CommandReport {
        let deadline = limit.map(|limit| tokio::time::Instant::now() + limit);
        let mut changed = self.changed.subscribe();
        loop {
            let wake = {
                let state = self.lock();
                let Some(command) = state.current.as_ref().filter(|c| c.id == id) else {
                    return self.report_of(&state, None);
                };
                if !command.running() {
                    return self.report_of(&state, None);
                }
                let quiet = command
                    .no_change_override
                    .unwrap_or(state.no_change_timeout);
                // A timeout too long to represent never passes.
                let stale = command.last_output.checked_add(quiet);
                let now = tokio::time::Instant::now();
                if stale.is_some_and(|stale| now >= stale) {
                    return self.report_of(&state, Some(CommandStatus::NoChangeTimeout));
                }
                if deadline.is_some_and(|deadline| now >= deadline) {
                    return self.report_of(&state, Some(CommandStatus::Running));
                }
                match (stale, deadline) {
                    (Some(stale), Some(deadline)) => Some(stale.min(deadline)),
                    (stale, deadline) => stale.or(deadline),
                }
            };
            let sleep = async {
                match wake {
                    Some(wake) => tokio::time::sleep_until(wake).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changed.changed() => {}
                () = sleep => {}
            }
        }
    }

    /// Takes what the shell wrote.
    pub(super) fn feed(self: &Arc<Self>, provisioner: &Arc<Provisioner>, chunk: &OutputChunk) {
        let finished = {
            let mut state = self.lock();
            let State {
                current,
                stdout,
                stderr,
                cwd,
                ..
            } = &mut *state;
            let Some(command) = current.as_mut().filter(|c| c.running()) else {
                return;
            };
            let (scan, index) = match (self.kind, chunk.stream) {
                (_, OutputStream::Stdout) => (stdout, 0),
                (SessionKind::Bash, OutputStream::Stderr) => (stderr, 1),
                // A merged session's stderr is its stdout; nothing else writes there.
                (SessionKind::Shell, OutputStream::Stderr) => return,
            };
            let (a, b) = command.nonce.split_at(command.nonce.len() / 2);
            let begin = [&[MARK, b'B'][..], a.as_bytes(), b.as_bytes()].concat();
            let end = [&[MARK, b'E'][..], a.as_bytes(), b.as_bytes()].concat();
            let mut events = Vec::new();
            scan.feed(&chunk.bytes, &begin, &end, &mut events);
            for event in events {
                match event {
                    Event::Output(bytes) => {
                        command.output[index].push(&bytes);
                        command.last_output = tokio::time::Instant::now();
                    }
                    Event::Begun(trailer) if index == 0 => {
                        command.begun = true;
                        command.begin_mark = parse_begin(&trailer);
                    }
                    Event::Begun(_) => {}
                    Event::Ended(trailer) => {
                        command.ends_seen[index] = true;
                        if index == 0 {
                            let trailer = String::from_utf8_lossy(&trailer);
                            let trailer = trailer.strip_prefix('\x1f').unwrap_or(&trailer);
                            let mut fields = trailer.splitn(2, '\x1f');
                            command.exit_code = fields.next().and_then(|rc| rc.parse().ok());
                            if let Some(pwd) = fields.next().filter(|p| p.starts_with('/')) {
                                *cwd = pwd.to_owned();
                            }
                        }
                    }
                }
            }
            let needed = match self.kind {
                SessionKind::Shell => 1,
                SessionKind::Bash => 2,
            };
            let done = command.ends_seen[..needed].iter().all(|seen| *seen);
            let id = command.id.clone();
            drop(state);
            if done {
                self.finish_current(&id, Finish::Marked)
            } else {
                self.notify();
                None
            }
        };
        if let Some((run_id, outcome)) = finished {
            let provisioner = provisioner.clone();
            tokio::spawn(async move { record_run(&provisioner, &run_id, outcome).await });
        }
    }

    /// Ends the command `id` if it still runs; returns its run record's id and outcome.
    pub(super) fn finish_current(&self, id: &str, how: Finish) -> Option<(String, RunOutcome)> {
        let outcome = {
            let mut state = self.lock();
            let command = state
                .current
                .as_mut()
                .filter(|c| c.id == id && c.running())?;
            for capture in &mut command.output {
                capture.finish();
            }
            let (status, failure) = match (&how, command.stop) {
                (Finish::Undelivered, _) => (
                    CommandStatus::Terminated,
                    Some("the command never reached the session's shell".to_owned()),
                ),
                (_, Some(Stop::HardTimeout)) => (CommandStatus::HardTimeout, None),
                (_, Some(Stop::Kill)) => (CommandStatus::Killed, None),
                (Finish::Marked, None) => (CommandStatus::Completed, None),
                (Finish::ShellEnded(_), None) => (CommandStatus::Terminated, None),
            };
            if let Finish::ShellEnded(code) = how {
                command.exit_code = command.exit_code.or(code);
            }
            command.finished = Some(status);
            command.busy = None;
            let outcome = RunOutcome {
                exit_code: command.exit_code,
                signal: None,
                timed_out: status == CommandStatus::HardTimeout,
                duration_ms: i64::try_from(command.started.elapsed().as_millis())
                    .unwrap_or(i64::MAX),
                cpu_user_ms: None,
                cpu_system_ms: None,
                peak_memory_bytes: None,
                failure,
            };
            (command.run_id.clone(), outcome)
        };
        self.notify();
        Some(outcome)
    }

    /// Asks the driver to kill the shell and its whole tree (I24).
    pub(super) fn request_close(&self) {
        if let Some(close) = self.lock().close.take() {
            let _ = close.send(());
        }
    }

    /// Closes the session and waits (bounded) until its shell's tree is gone.
    pub(super) async fn close(&self) {
        self.request_close();
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + CLOSE_TIMEOUT;
        while !self.ended() {
            tokio::select! {
                result = changed.changed() => if result.is_err() { return },
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(sandbox = %self.sandbox, session = %self.id, "a closed shell session did not end in time");
                    return;
                }
            }
        }
    }

    /// When an idle session is closed: `idle` after its last use, unless a command runs.
    pub(super) fn idle_deadline(&self, idle: Duration) -> Option<tokio::time::Instant> {
        let state = self.lock();
        if state.current.as_ref().is_some_and(Command::running) {
            return None;
        }
        Some(tokio::time::Instant::from_std(state.last_used + idle))
    }
}
