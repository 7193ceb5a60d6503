//! What the provisioner counts, in Prometheus form: sandboxes by state, runtime start and
//! exec latency, reaps, fence waits, stale guard fences, and failures by cause. `GET /metrics` renders it.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use warren_store::SandboxState;

use crate::{Provisioner, ProvisionerError};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

/// Why a reaper pass reclaimed a runtime.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ReapReason {
    Idle,
    MaxLifetime,
}

/// What went wrong, for `warren_failures_total{cause}`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FailureCause {
    /// The backend could not start a runtime.
    RuntimeStart,
    /// A runtime vanished under a command.
    RuntimeLost,
    /// The backend failed an exec.
    Exec,
    /// The state store failed.
    Store,
    /// The backend failed to destroy a runtime.
    Destroy,
    /// A runtime snapshot before a reap failed; the runtime was reaped without it.
    Snapshot,
}

/// The provisioner's metrics registry.
pub(crate) struct Metrics {
    registry: Registry,
    sandboxes: Family<StateLabel, Gauge>,
    runtime_start: Histogram,
    exec: Histogram,
    fence_wait: Histogram,
    stale_fences: Counter,
    reaps: Family<ReasonLabel, Counter>,
    deadlines: Family<ActionLabel, Counter>,
    failures: Family<CauseLabel, Counter>,
    takeovers: Counter,
    self_fences: Counter,
    forwarded: Counter,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("warren");
        let sandboxes = Family::<StateLabel, Gauge>::default();
        // 1 ms to about 65 s.
        let seconds = || Histogram::new(exponential_buckets(0.001, 2.0, 17));
        let runtime_start = seconds();
        let exec = seconds();
        let fence_wait = seconds();
        let stale_fences = Counter::default();
        let reaps = Family::<ReasonLabel, Counter>::default();
        let deadlines = Family::<ActionLabel, Counter>::default();
        let failures = Family::<CauseLabel, Counter>::default();
        let takeovers = Counter::default();
        let self_fences = Counter::default();
        let forwarded = Counter::default();
        registry.register(
            "takeovers",
            "Runtimes this node took over from a node whose lease lapsed (issue 14)",
            takeovers.clone(),
        );
        registry.register(
            "self_fences",
            "Times this node fenced itself: its lease could not be renewed in time",
            self_fences.clone(),
        );
        registry.register(
            "forwarded",
            "Runtime operations forwarded to the node that owns the runtime",
            forwarded.clone(),
        );
        registry.register(
            "sandboxes",
            "Sandboxes by state (created, running, stopped, pausing, paused, terminating, terminated)",
            sandboxes.clone(),
        );
        registry.register(
            "runtime_start_seconds",
            "Time to start a runtime on first use",
            runtime_start.clone(),
        );
        registry.register(
            "exec_seconds",
            "Time from an exec request to the command's end, runtime start included",
            exec.clone(),
        );
        registry.register(
            "fence_wait_seconds",
            "Time a termination waited behind its fence for running commands",
            fence_wait.clone(),
        );
        registry.register(
            "stale_fences",
            "Mutations refused because a newer execution guard token was issued (fence_stale)",
            stale_fences.clone(),
        );
        registry.register("reaps", "Runtimes reclaimed by the reaper", reaps.clone());
        registry.register(
            "deadlines",
            "Sandboxes this node ended or paused because their deadline passed",
            deadlines.clone(),
        );
        registry.register("failures", "Failures by cause", failures.clone());
        // Every label value exists from the start, so a rate() over it never begins absent.
        for reason in [ReapReason::Idle, ReapReason::MaxLifetime] {
            let _ = reaps.get_or_create(&reason.label());
        }
        for action in warren_store::DeadlineAction::ALL {
            let _ = deadlines.get_or_create(&ActionLabel {
                action: action.as_str(),
            });
        }
        for cause in [
            FailureCause::RuntimeStart,
            FailureCause::RuntimeLost,
            FailureCause::Exec,
            FailureCause::Store,
            FailureCause::Destroy,
            FailureCause::Snapshot,
        ] {
            let _ = failures.get_or_create(&cause.label());
        }
        Self {
            registry,
            sandboxes,
            runtime_start,
            exec,
            fence_wait,
            stale_fences,
            reaps,
            deadlines,
            failures,
            takeovers,
            self_fences,
            forwarded,
        }
    }

    pub(crate) fn runtime_started(&self, took: Duration) {
        self.runtime_start.observe(took.as_secs_f64());
    }

    pub(crate) fn exec_finished(&self, took: Duration) {
        self.exec.observe(took.as_secs_f64());
    }

    pub(crate) fn fence_waited(&self, took: Duration) {
        self.fence_wait.observe(took.as_secs_f64());
    }

    pub(crate) fn fence_refused(&self) {
        self.stale_fences.inc();
    }

    pub(crate) fn reaped(&self, reason: ReapReason) {
        self.reaps.get_or_create(&reason.label()).inc();
    }

    pub(crate) fn deadline_fired(&self, action: warren_store::DeadlineAction) {
        self.deadlines
            .get_or_create(&ActionLabel {
                action: action.as_str(),
            })
            .inc();
    }

    pub(crate) fn took_over(&self) {
        self.takeovers.inc();
    }

    pub(crate) fn self_fenced(&self) {
        self.self_fences.inc();
    }

    pub(crate) fn forwarded(&self) {
        self.forwarded.inc();
    }

    pub(crate) fn failed(&self, cause: FailureCause) {
        self.failures.get_or_create(&cause.label()).inc();
    }
}

impl ReapReason {
    fn label(self) -> ReasonLabel {
        ReasonLabel {
            reason: match self {
                Self::Idle => "idle",
                Self::MaxLifetime => "max_lifetime",
            },
        }
    }
}

impl FailureCause {
    fn label(self) -> CauseLabel {
        CauseLabel {
            cause: match self {
                Self::RuntimeStart => "runtime_start",
                Self::RuntimeLost => "runtime_lost",
                Self::Exec => "exec",
                Self::Store => "store",
                Self::Destroy => "destroy",
                Self::Snapshot => "snapshot",
            },
        }
    }
}

impl Provisioner {
    /// The metrics in the Prometheus text format (OpenMetrics flavour). Sandbox counts are
    /// read from the state store at each scrape, so they are right after a restart too.
    pub async fn render_metrics(&self) -> Result<String, ProvisionerError> {
        let records = self.store.list_sandboxes(None).await?;
        for state in SandboxState::ALL {
            let count = records.iter().filter(|r| r.state == state).count();
            self.metrics
                .sandboxes
                .get_or_create(&StateLabel {
                    state: state.as_str(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.metrics.registry)
            .expect("encoding only fails when its writer does, and a String never does");
        Ok(text)
    }
}
