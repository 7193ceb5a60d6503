//! Run-to-completion over the process primitive: every backend's `exec` is a process
//! started with [`Backend::start_process`](crate::Backend::start_process) and followed
//! here to its end, so a command and a long-running process are one mechanism (issue 32).
//!
//! Its stdin gets the request's bytes and closes; its output is kept up to the cap (and
//! streamed to the sink as it comes); its tree is killed through the runtime's one killer
//! when the timeout passes or the sink closes (I24). Output still in a pipe that a
//! background process keeps open (I6) is taken once the command exited and a short grace
//! passed, without waiting for that process.

use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    BackendError, ExecOutcome, ExecRequest, OutputChunk, OutputSink, OutputStream, ProcessHandle,
    ProcessOutput, ProcessRequest, ProcessSignal, ProcessStart,
};

/// How long output is still read after the command exited, for pipes a background
/// process it started keeps open: after that, what is in the pipes is taken and the
/// answer goes.
pub const OUTPUT_GRACE: Duration = Duration::from_millis(150);

/// Most bytes taken from a pipe once the grace passed: the most a pipe can hold
/// (`/proc/sys/fs/pipe-max-size`'s default), so a background process that keeps writing
/// cannot hold the answer.
const DRAIN_LIMIT: usize = 1 << 20;

impl ExecRequest {
    /// The process this command starts: no terminal; its stdin is [`ExecRequest::stdin`].
    pub fn process(&self) -> ProcessRequest {
        ProcessRequest {
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            pty: None,
        }
    }
}

impl ExecOutcome {
    /// What a command the runtime could not start answers: 126 when it is not
    /// executable, 127 otherwise (as a shell does), and why on stderr.
    pub fn not_started(stage: &str, errno: i32, request: &ExecRequest, began: Instant) -> Self {
        const EACCES: i32 = 13;
        let program = request.argv.first().map_or("", String::as_str);
        let message = ProcessStart::failure_message(stage, errno, program, &request.cwd);
        Self {
            exit_code: Some(if stage == "exec" && errno == EACCES {
                126
            } else {
                127
            }),
            stderr: format!("warren: {message}\n").into_bytes(),
            duration: began.elapsed(),
            ..Self::default()
        }
    }
}

/// Follows a started process to its end as a command (see the module's text); `began`
/// is when the caller asked, for the duration.
pub async fn run_to_completion(
    started: ProcessStart,
    request: &ExecRequest,
    sink: Option<OutputSink>,
    began: Instant,
) -> Result<ExecOutcome, BackendError> {
    let ProcessHandle {
        stdin,
        stdout,
        stderr,
        control,
        exit,
        ..
    } = match started {
        ProcessStart::Started(handle) => handle,
        ProcessStart::Failed { stage, errno } => {
            return Ok(ExecOutcome::not_started(&stage, errno, request, began))
        }
    };
    let bytes = request.stdin.clone();
    // A command may never read its stdin: the writer is dropped with it, unfinished.
    let writer = tokio::spawn(async move {
        let mut stdin = stdin;
        let _ = stdin.write_all(&bytes).await;
        let _ = stdin.shutdown().await;
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let collect = |output: Option<ProcessOutput>, stream| {
        let collected = Collected {
            kept: Vec::new(),
            truncated: false,
            cap: request.output_cap,
            stream,
            sink: sink.clone(),
        };
        tokio::spawn(collected.read(output, stopped.clone()))
    };
    let out = collect(Some(stdout), OutputStream::Stdout);
    let err = collect(stderr, OutputStream::Stderr);

    let mut outcome = ExecOutcome::default();
    let deadline = tokio::time::sleep(request.timeout);
    tokio::pin!(deadline);
    let sink_closed = async {
        match &sink {
            Some(sink) => sink.closed().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sink_closed);
    tokio::pin!(exit);
    let mut killed = false;
    let ended = loop {
        tokio::select! {
            ended = &mut exit => break ended,
            () = &mut deadline, if !killed => {
                outcome.timed_out = true;
                killed = true;
                control.send(ProcessSignal::Kill).await;
            }
            () = &mut sink_closed, if !killed => {
                // The client went away mid-stream: nothing may keep running for nobody.
                killed = true;
                control.send(ProcessSignal::Kill).await;
            }
        }
    };
    writer.abort();
    // Pipes still held open by background processes (I6) must not hold the answer.
    let both = async { (out.await, err.await) };
    tokio::pin!(both);
    let (out, err) = tokio::select! {
        collected = &mut both => collected,
        () = tokio::time::sleep(OUTPUT_GRACE) => {
            let _ = stop.send(true);
            both.await
        }
    };
    let exit = ended?;
    let (out, err) = (out.unwrap_or_default(), err.unwrap_or_default());
    outcome.exit_code = exit.exit_code;
    outcome.signal = exit.signal;
    outcome.usage = exit.usage;
    outcome.truncated = out.1 || err.1;
    outcome.stdout = out.0;
    outcome.stderr = err.0;
    outcome.duration = began.elapsed();
    Ok(outcome)
}

/// One stream's output as it is collected.
struct Collected {
    kept: Vec<u8>,
    truncated: bool,
    cap: usize,
    stream: OutputStream,
    sink: Option<OutputSink>,
}

impl Collected {
    /// Reads the stream to its end, or, on `stop`, takes what it holds now; the bytes
    /// kept and whether some were cut.
    async fn read(
        mut self,
        output: Option<ProcessOutput>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> (Vec<u8>, bool) {
        let Some(mut output) = output else {
            return (self.kept, self.truncated);
        };
        let mut buffer = vec![0u8; 64 * 1024];
        let stopped = loop {
            let n = tokio::select! {
                // Data first: under load, the stop may arrive before this task got to
                // read bytes the command wrote long before it exited.
                biased;
                read = output.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => break false,
                    Ok(n) => n,
                },
                _ = stop.changed() => break true,
            };
            if !self.take(&buffer[..n]).await {
                return (self.kept, self.truncated);
            }
        };
        if stopped {
            // Whatever the command wrote before it exited is in the stream now.
            let mut drained = 0;
            while drained < DRAIN_LIMIT {
                match output.as_mut().read_now(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        drained += n;
                        if !self.take(&buffer[..n]).await {
                            break;
                        }
                    }
                }
            }
        }
        (self.kept, self.truncated)
    }

    /// Keeps `bytes` under the cap and streams them; false once the sink is gone.
    async fn take(&mut self, bytes: &[u8]) -> bool {
        let room = self.cap.saturating_sub(self.kept.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        match &self.sink {
            Some(sink) => sink
                .send(OutputChunk {
                    stream: self.stream,
                    bytes: bytes.to_vec(),
                })
                .await
                .is_ok(),
            None => true,
        }
    }
}

/// A process's output stream: read as it comes, and, once its process ended, what it
/// holds taken at once ([`OutputReader::read_now`]).
pub trait OutputReader: tokio::io::AsyncRead + Send {
    /// Reads what the stream holds now into `buffer`, without waiting for more: `Ok(0)`
    /// when it holds nothing (or ended).
    fn read_now(self: Pin<&mut Self>, buffer: &mut [u8]) -> std::io::Result<usize>;
}

/// The read end of a pipe from a process: what it holds is read from the descriptor
/// itself, since the reactor may not have seen it become readable yet (tokio's own read
/// would then say "nothing").
impl OutputReader for tokio::net::unix::pipe::Receiver {
    fn read_now(self: Pin<&mut Self>, buffer: &mut [u8]) -> std::io::Result<usize> {
        // The descriptor is non-blocking (tokio made it so): an empty pipe is EAGAIN.
        match rustix::io::read(&*self, buffer) {
            Ok(n) => Ok(n),
            Err(rustix::io::Errno::AGAIN) => Ok(0),
            Err(error) => Err(error.into()),
        }
    }
}

/// An in-memory stream (a backend that relays output from a connection): what it holds
/// is there for one poll.
impl OutputReader for tokio::io::ReadHalf<tokio::io::SimplexStream> {
    fn read_now(self: Pin<&mut Self>, buffer: &mut [u8]) -> std::io::Result<usize> {
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        let mut read = tokio::io::ReadBuf::new(buffer);
        match tokio::io::AsyncRead::poll_read(self, &mut context, &mut read) {
            std::task::Poll::Ready(Ok(())) => Ok(read.filled().len()),
            std::task::Poll::Ready(Err(error)) => Err(error),
            std::task::Poll::Pending => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ProcessControl, ProcessExit};

    fn request(stdin: &[u8], cap: usize, timeout: Duration) -> ExecRequest {
        ExecRequest {
            argv: vec!["cat".into()],
            cwd: "/".into(),
            env: Default::default(),
            stdin: stdin.to_vec(),
            timeout,
            output_cap: cap,
        }
    }

    /// A process whose stdin is echoed to stdout by a task, which exits 0 at stdin's end
    /// (or 137 once killed).
    fn echo() -> ProcessStart {
        let (stdin_read, stdin_write) = tokio::io::simplex(64);
        let (stdout_read, mut stdout_write) = tokio::io::simplex(64);
        let (control, mut requests) = ProcessControl::channel();
        let exit = async move {
            let mut stdin_read = stdin_read;
            let mut buffer = [0u8; 16];
            loop {
                tokio::select! {
                    read = stdin_read.read(&mut buffer) => match read {
                        Ok(0) | Err(_) => return Ok(ProcessExit { exit_code: Some(0), ..ProcessExit::default() }),
                        Ok(n) => { let _ = stdout_write.write_all(&buffer[..n]).await; }
                    },
                    Some(crate::Control { signal: ProcessSignal::Kill, .. }) = requests.recv() => {
                        return Ok(ProcessExit { signal: Some(9), ..ProcessExit::default() });
                    }
                }
            }
        };
        ProcessStart::Started(ProcessHandle {
            pid: 7,
            stdin: Box::pin(stdin_write),
            stdout: Box::pin(stdout_read),
            stderr: None,
            control,
            exit: Box::pin(exit),
        })
    }

    #[tokio::test]
    async fn a_command_gets_its_stdin_and_its_output_is_kept_up_to_the_cap() {
        let request = request(&[b'x'; 300], 100, Duration::from_secs(30));
        let outcome = run_to_completion(echo(), &request, None, Instant::now())
            .await
            .unwrap();
        assert_eq!(outcome.exit_code, Some(0));
        assert_eq!(outcome.stdout, vec![b'x'; 100]);
        assert!(outcome.truncated);
    }

    #[tokio::test]
    async fn a_command_past_its_timeout_is_killed_and_says_so() {
        // A command that reads nothing and ends only when killed.
        let (_stdin_read, stdin_write) = tokio::io::simplex(64);
        let (stdout_read, _stdout_write) = tokio::io::simplex(64);
        let (control, mut requests) = ProcessControl::channel();
        let exit = async move {
            while let Some(request) = requests.recv().await {
                if request.signal == ProcessSignal::Kill {
                    return Ok(ProcessExit {
                        signal: Some(9),
                        ..ProcessExit::default()
                    });
                }
            }
            Ok(ProcessExit::default())
        };
        let started = ProcessStart::Started(ProcessHandle {
            pid: 8,
            stdin: Box::pin(stdin_write),
            stdout: Box::pin(stdout_read),
            stderr: None,
            control,
            exit: Box::pin(exit),
        });
        let request = request(b"", 100, Duration::from_millis(50));
        let outcome = run_to_completion(started, &request, None, Instant::now());
        let outcome = tokio::time::timeout(Duration::from_secs(5), outcome)
            .await
            .expect("ended by its timeout")
            .unwrap();
        assert!(outcome.timed_out);
        assert_eq!(outcome.signal, Some(9));
    }

    fn collected(cap: usize) -> Collected {
        Collected {
            kept: Vec::new(),
            truncated: false,
            cap,
            stream: OutputStream::Stdout,
            sink: None,
        }
    }

    fn pipe_output(fd: std::os::fd::OwnedFd) -> Option<ProcessOutput> {
        Some(Box::pin(
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd).unwrap(),
        ))
    }

    /// Under load the collector may first run after the grace has passed and `stop` was
    /// sent: the output already in the pipe must still be returned whole, also while a
    /// background process keeps the pipe open.
    #[tokio::test]
    async fn output_written_before_the_stop_is_never_lost() {
        for round in 0..64 {
            let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
            rustix::io::write(&write, b"x711\n").unwrap();
            let (stop, stopped) = tokio::sync::watch::channel(false);
            stop.send(true).unwrap();
            let (kept, truncated) = collected(1024).read(pipe_output(read), stopped).await;
            assert_eq!(kept, b"x711\n", "round {round}: output lost");
            assert!(!truncated);
            // The writer (a background process) is still there and must not be waited for.
            drop(write);
        }
    }

    #[tokio::test]
    async fn a_writer_that_never_stops_does_not_hold_the_drain() {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        let chunk = vec![b'y'; 4096];
        // Something is in the pipe before the stop, and more keeps coming after it.
        rustix::io::write(&write, &chunk).unwrap();
        let writer = std::thread::spawn(move || while rustix::io::write(&write, &chunk).is_ok() {});
        let (stop, stopped) = tokio::sync::watch::channel(false);
        stop.send(true).unwrap();
        let (kept, truncated) = tokio::time::timeout(
            Duration::from_secs(10),
            collected(100).read(pipe_output(read), stopped),
        )
        .await
        .expect("the drain is bounded");
        assert_eq!(kept.len(), 100);
        assert!(truncated);
        // The read end is closed: the writer gets EPIPE and ends.
        writer.join().unwrap();
    }

    #[test]
    fn a_command_that_could_not_start_answers_as_a_shell_would() {
        let request = request(b"", 1, Duration::from_secs(1));
        let not_executable = ExecOutcome::not_started("exec", 13, &request, Instant::now());
        assert_eq!(not_executable.exit_code, Some(126));
        let missing = ExecOutcome::not_started("exec", 2, &request, Instant::now());
        assert_eq!(missing.exit_code, Some(127));
        assert!(String::from_utf8_lossy(&missing.stderr).starts_with("warren: cannot run \"cat\""));
    }
}
