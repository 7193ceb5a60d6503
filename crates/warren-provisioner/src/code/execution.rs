//! One execution under way: its events from the driver's output, its deadline (interrupt,
//! then a new context), its end recorded as a run (I22) and as the sandbox's last activity,
//! and the interrupt a caller that went away leaves behind.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt as _;
use warren_backend::OutputStream;
use warren_core::{SandboxId, SecretMasker};
use warren_store::RunOutcome;

use super::driver::{driver_failure, event_for, mask_event, started, Lines};
use super::{CodeContext, CodeEvent, ExecutionStatus, MAX_EVENT_BYTES};
use crate::processes::OutputEvent;
use crate::Provisioner;

/// After an execution's timeout interrupted its kernel, how long the kernel has to stop;
/// then its context is restarted (its state is lost).
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// How long a kernel still starting when its execution's timeout passed has to start (the
/// driver then ends the execution unrun; it gives up on a kernel after 60 s itself).
const START_GRACE: Duration = Duration::from_secs(90);

/// One execution under way.
pub(super) struct Execution {
    pub(super) provisioner: Arc<Provisioner>,
    pub(super) sandbox: SandboxId,
    pub(super) context: CodeContext,
    pub(super) request: String,
    pub(super) masker: SecretMasker,
    pub(super) timeout: Option<Duration>,
    /// Its run record.
    pub(super) run_id: String,
    /// When it was asked for.
    pub(super) started: std::time::Instant,
    /// How it ended, once its end came.
    pub(super) status: Option<ExecutionStatus>,
    /// Its end was handed on: dropping it interrupts nothing.
    pub(super) ended: bool,
    /// Its end was recorded (before it was handed on): dropping it records nothing.
    pub(super) recorded: bool,
    /// Holds the sandbox busy (the context's driver is quiet) until the execution ended
    /// and its end was recorded as the sandbox's last activity.
    pub(super) busy: Option<crate::InflightHold>,
}

impl Execution {
    /// The driver request that interrupts this execution, and only it.
    fn interrupt_line(&self) -> Vec<u8> {
        let mut line = serde_json::json!({"op": "interrupt", "id": self.request})
            .to_string()
            .into_bytes();
        line.push(b'\n');
        line
    }
}

impl Drop for Execution {
    /// The end of an execution is the sandbox's last activity: the idle timeout counts
    /// from it, and the sandbox stays busy until that is recorded. A caller that went away
    /// before the end interrupts its execution (or drops it, when it still waits behind
    /// another), so an abandoned loop does not hold the kernel.
    fn drop(&mut self) {
        if self.recorded {
            return;
        }
        let busy = self.busy.take();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let provisioner = self.provisioner.clone();
        let sandbox = self.sandbox.clone();
        let pid = self.context.pid;
        let interrupt = (!self.ended).then(|| self.interrupt_line());
        let outcome = self.outcome();
        let run_id = self.run_id.clone();
        runtime.spawn(async move {
            if let Some(line) = interrupt {
                let _ = provisioner.write_stdin(&sandbox, pid, &line, false).await;
            }
            record(&provisioner, &sandbox, &run_id, &outcome).await;
            drop(busy);
        });
    }
}

impl Execution {
    /// Its run's outcome, as far as it came.
    fn outcome(&self) -> RunOutcome {
        RunOutcome {
            exit_code: match self.status {
                Some(ExecutionStatus::Ok) => Some(0),
                Some(ExecutionStatus::Error) => Some(1),
                Some(ExecutionStatus::Timeout) | None => None,
            },
            timed_out: self.status == Some(ExecutionStatus::Timeout),
            duration_ms: i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX),
            failure: self
                .status
                .is_none()
                .then(|| "interrupted: the caller went away before the end".to_owned()),
            ..RunOutcome::default()
        }
    }

    /// Records its end before the end is handed on, so a caller that saw the end reads a
    /// finished run; then the sandbox is no longer busy with it.
    async fn record_end(&mut self) {
        let outcome = self.outcome();
        record(&self.provisioner, &self.sandbox, &self.run_id, &outcome).await;
        self.recorded = true;
        self.busy = None;
    }
}

/// Finishes an execution's run; finishing it moves the sandbox's last activity too.
async fn record(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    run_id: &str,
    outcome: &RunOutcome,
) {
    if let Err(crate::exec::RunError::Store(error)) =
        crate::exec::record_outcome(provisioner.store.as_ref(), run_id, outcome).await
    {
        tracing::warn!(%sandbox, %error, "could not record the end of an execution");
    }
}

/// Where an execution's stream is.
enum Phase {
    /// Waiting for the kernel (`true` once it began to run this request).
    Running(bool),
    /// Its timeout passed and the kernel was interrupted: waiting for it to stop.
    Interrupted,
    /// Its end was handed on.
    Done,
}

impl Execution {
    pub(super) fn events(
        self,
        output: BoxStream<'static, OutputEvent>,
    ) -> BoxStream<'static, CodeEvent> {
        let deadline = self
            .timeout
            .map(|timeout| tokio::time::Instant::now() + timeout);
        // Every line of this request begins so (the driver writes its id first).
        let lines = Lines::only(format!("{{\"id\":\"{}\",", self.request));
        let state = (
            self,
            output,
            lines,
            Phase::Running(false),
            deadline,
            std::collections::VecDeque::<CodeEvent>::new(),
        );
        futures::stream::unfold(
            state,
            |(mut execution, mut output, mut lines, mut phase, mut deadline, mut queue)| async move {
                loop {
                    if let Some(event) = queue.pop_front() {
                        if let CodeEvent::End { status, .. } = &event {
                            phase = Phase::Done;
                            execution.ended = true;
                            execution.status = Some(*status);
                            execution.record_end().await;
                        }
                        let event = mask_event(event, &execution.masker);
                        return Some((event, (execution, output, lines, phase, deadline, queue)));
                    }
                    if matches!(phase, Phase::Done) {
                        return None;
                    }
                    let next = match deadline {
                        Some(at) => match tokio::time::timeout_at(at, output.next()).await {
                            Ok(next) => next,
                            Err(_) => {
                                deadline = execution.deadline_passed(&mut phase).await;
                                if matches!(phase, Phase::Done) {
                                    queue.extend(execution.timed_out(true));
                                }
                                continue;
                            }
                        },
                        None => output.next().await,
                    };
                    match next {
                        Some(OutputEvent::Output(piece)) if piece.stream == OutputStream::Stdout => {
                            let Ok(found) = lines.push(&piece.bytes) else {
                                // The rest of it cannot be read: the kernel stops too.
                                execution.interrupt().await;
                                queue.extend(driver_failure(
                                    "OutputTooLarge",
                                    format!(
                                        "one output of the execution is over {MAX_EVENT_BYTES} bytes"
                                    ),
                                    &execution.context.id,
                                ));
                                continue;
                            };
                            for line in found {
                                if started(&execution.request, &line) {
                                    match phase {
                                        Phase::Running(_) => phase = Phase::Running(true),
                                        // Interrupted while its kernel started: the driver
                                        // ends it now, unrun.
                                        Phase::Interrupted => {
                                            deadline =
                                                Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                                        }
                                        Phase::Done => {}
                                    }
                                    continue;
                                }
                                let Some(event) =
                                    event_for(&execution.request, &line, &execution.context.id)
                                else {
                                    continue;
                                };
                                let event = match (event, &phase) {
                                    (CodeEvent::End { context_id, execution_count, .. }, Phase::Interrupted) => {
                                        CodeEvent::End {
                                            context_id,
                                            execution_count,
                                            status: ExecutionStatus::Timeout,
                                        }
                                    }
                                    (event, _) => event,
                                };
                                queue.push_back(event);
                            }
                        }
                        Some(OutputEvent::Output(_)) => {}
                        Some(OutputEvent::Lost { from, to }) => {
                            execution.interrupt().await;
                            queue.extend(driver_failure(
                                "OutputLost",
                                format!("{} bytes of the execution's output were lost", to - from),
                                &execution.context.id,
                            ));
                        }
                        Some(OutputEvent::End(_)) | None => {
                            let ended = matches!(phase, Phase::Interrupted);
                            if ended {
                                queue.extend(execution.timed_out(false));
                            } else {
                                queue.extend(driver_failure(
                                    "KernelDied",
                                    "the context's kernel ended (its runtime ended, or it was \
                                     removed); its state is lost"
                                        .to_owned(),
                                    &execution.context.id,
                                ));
                            }
                        }
                    }
                }
            },
        )
        .boxed()
    }

    /// Interrupts this execution (and nothing else) in the kernel.
    async fn interrupt(&self) {
        let line = self.interrupt_line();
        let _ = self
            .provisioner
            .write_stdin(&self.sandbox, self.context.pid, &line, false)
            .await;
    }

    /// The timeout passed: interrupt the kernel, and give it [`INTERRUPT_GRACE`]; after
    /// that, restart the context. Returns the next deadline.
    async fn deadline_passed(&self, phase: &mut Phase) -> Option<tokio::time::Instant> {
        match *phase {
            Phase::Running(began) => {
                *phase = Phase::Interrupted;
                self.interrupt().await;
                let grace = if began { INTERRUPT_GRACE } else { START_GRACE };
                Some(tokio::time::Instant::now() + grace)
            }
            Phase::Interrupted | Phase::Done => {
                // The kernel does not stop: its context starts anew, empty.
                let _ = self
                    .provisioner
                    .kill_process(&self.sandbox, self.context.pid)
                    .await;
                *phase = Phase::Done;
                None
            }
        }
    }

    fn timed_out(&self, killed: bool) -> [CodeEvent; 2] {
        let value = if killed {
            "the execution's timeout passed and its kernel did not stop when interrupted: the \
             context was removed and its state is lost"
        } else {
            "the execution's timeout passed; its kernel was interrupted"
        };
        [
            CodeEvent::Error {
                name: "TimeoutError".to_owned(),
                value: value.to_owned(),
                traceback: Vec::new(),
            },
            CodeEvent::End {
                context_id: self.context.id.clone(),
                execution_count: None,
                status: ExecutionStatus::Timeout,
            },
        ]
    }
}
