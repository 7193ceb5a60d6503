//! The session's shell process: read, reported ready, closed, and its end recorded.

use tokio::io::AsyncReadExt;

use super::*;

/// What the driver holds of the session's shell (its stdin and control are the session's).
pub(super) struct Shell {
    /// Its stdout, and its stderr (a merged session's is empty).
    pub(super) outputs: Vec<(warren_backend::ProcessOutput, OutputStream)>,
    /// To kill it.
    pub(super) control: ProcessControl,
    /// Its end.
    pub(super) exit: warren_backend::ProcessWait,
}

/// Runs the session's shell: reads its output and feeds it to the session, reports it
/// ready (`ready` gets what its ready line said), kills it on request or when idle, and
/// ends the session when the shell ends.
pub(super) async fn drive(
    provisioner: Arc<Provisioner>,
    session: Arc<Session>,
    shell: Shell,
    ready_token: Vec<u8>,
    ready: oneshot::Sender<Result<Flavor, StartFailure>>,
    mut close: oneshot::Receiver<()>,
) {
    let Shell {
        outputs,
        control,
        exit,
    } = shell;
    let (sink, mut chunks) = mpsc::channel::<OutputChunk>(64);
    let pumps: Vec<_> = outputs
        .into_iter()
        .map(|(output, stream)| tokio::spawn(pump(output, stream, sink.clone())))
        .collect();
    drop(sink);
    tokio::pin!(exit);
    let mut ready = Some(ready);
    // What the bootstrap wrote before it was ready (its errors, if it fails).
    let mut early: Vec<u8> = Vec::new();
    type Ready = Option<oneshot::Sender<Result<Flavor, StartFailure>>>;
    let take = |chunk: OutputChunk, early: &mut Vec<u8>, ready: &mut Ready| {
        let Some(waiting) = ready.take() else {
            session.feed(&provisioner, &chunk);
            return;
        };
        early.extend_from_slice(&chunk.bytes);
        match parse_ready(early, &ready_token) {
            Some(flavor) => {
                let _ = session.flavor.set(flavor);
                if waiting.send(Ok(flavor)).is_err() {
                    // The opener gave up waiting: nobody will use this shell.
                    session.request_close();
                }
                early.clear();
            }
            None => {
                if early.len() > 64 * 1024 {
                    early.drain(..early.len() - 4096);
                }
                *ready = Some(waiting);
            }
        }
    };
    let mut killing = false;
    let mut reading = true;
    let idle = provisioner.config.idle_timeout;
    let result = loop {
        let idle_at = session.idle_deadline(idle);
        tokio::select! {
            result = &mut exit => break result,
            chunk = chunks.recv(), if reading => match chunk {
                Some(chunk) => take(chunk, &mut early, &mut ready),
                None => reading = false,
            },
            _ = &mut close, if !killing => {
                killing = true;
                control.send(ProcessSignal::Kill).await;
            }
            () = async { tokio::time::sleep_until(idle_at.unwrap_or_else(tokio::time::Instant::now)).await }, if idle_at.is_some() && !killing => {
                if session.idle_deadline(idle).is_some_and(|at| at <= tokio::time::Instant::now()) {
                    tracing::info!(sandbox = %session.sandbox, session = %session.id, "closing an idle shell session");
                    killing = true;
                    control.send(ProcessSignal::Kill).await;
                }
            }
        }
    };
    // What the shell wrote before it ended is in the pipes: take it, but a pipe that a
    // background job holds open keeps nobody waiting past the grace.
    let rest = async {
        while let Some(chunk) = chunks.recv().await {
            take(chunk, &mut early, &mut ready);
        }
    };
    let _ = tokio::time::timeout(OUTPUT_GRACE, rest).await;
    for pump in pumps {
        pump.abort();
    }
    let exit_code = result.as_ref().ok().and_then(|exit| exit.exit_code);
    if !killing && ready.is_none() {
        // Nobody asked for it: `exit` in a command, or the shell was killed.
        match &result {
            Ok(exit) if exit.signal.is_some() => {
                tracing::warn!(sandbox = %session.sandbox, session = %session.id, signal = ?exit.signal, "a shell session's shell was killed")
            }
            Ok(exit) => {
                tracing::info!(sandbox = %session.sandbox, session = %session.id, exit_code = ?exit.exit_code, "a shell session's shell ended")
            }
            Err(error) => {
                tracing::warn!(sandbox = %session.sandbox, session = %session.id, %error, "a shell session's shell was lost")
            }
        }
    }
    if let Some(ready) = ready.take() {
        let failure = match &result {
            Err(BackendError::RuntimeNotFound { sandbox }) => {
                StartFailure::Backend(BackendError::RuntimeNotFound {
                    sandbox: sandbox.clone(),
                })
            }
            Err(error) => StartFailure::Shell(format!("the runtime could not run it: {error}")),
            Ok(exit) => StartFailure::Shell(format!(
                "the shell ended at once ({})",
                describe_exit(exit, &String::from_utf8_lossy(&early))
            )),
        };
        let _ = ready.send(Err(failure));
    }
    let running = {
        let mut state = session.lock();
        state.ended = Some((exit_code, Instant::now()));
        state.close = None;
        state
            .current
            .as_ref()
            .filter(|c| c.running())
            .map(|c| c.id.clone())
    };
    if let Some(id) = running {
        if let Some((run_id, mut outcome)) =
            session.finish_current(&id, Finish::ShellEnded(exit_code))
        {
            if outcome.exit_code.is_none() {
                outcome.failure = Some(match &result {
                    Err(error) => format!("backend_error: {error}"),
                    Ok(_) => "the session's shell was killed".to_owned(),
                });
            }
            record_run(&provisioner, &run_id, outcome).await;
        }
    }
    session.notify();
}

/// Reads one output stream of the shell into `sink`, until it ends.
async fn pump(
    mut output: warren_backend::ProcessOutput,
    stream: OutputStream,
    sink: mpsc::Sender<OutputChunk>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let bytes = match output.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer[..n].to_vec(),
        };
        if sink.send(OutputChunk { stream, bytes }).await.is_err() {
            return;
        }
    }
}
