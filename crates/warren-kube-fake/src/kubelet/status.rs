//! The pod's status as the kubelet reports it, and the resource arithmetic behind it
//! (QoS class, CPU requests, quantities).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::StatusReporter;

use super::{Network, PodRun, TICK};

/// The pod's status as the kubelet last reported it, and how it changes.
pub(super) struct StatusBook<'a> {
    run: &'a PodRun,
    reporter: &'a StatusReporter,
    status: PodStatus,
    init_names: Vec<String>,
    names: Vec<String>,
    pod_name_for_ids: String,
}

/// The order a kubelet lists conditions in.
const CONDITIONS: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
];

impl<'a> StatusBook<'a> {
    pub(super) fn new(run: &'a PodRun, reporter: &'a StatusReporter, spec: &PodSpec) -> Self {
        let init_names: Vec<String> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect();
        let names = spec.containers.iter().map(|c| c.name.clone()).collect();
        let status_of = |c: &Container| ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            image_id: String::new(),
            ready: false,
            restart_count: 0,
            started: Some(false),
            state: Some(waiting(
                if init_names.is_empty() {
                    "ContainerCreating"
                } else {
                    "PodInitializing"
                },
                None,
            )),
            ..ContainerStatus::default()
        };
        let status = PodStatus {
            phase: Some("Pending".to_owned()),
            qos_class: Some(qos_class(spec).to_owned()),
            init_container_statuses: (!init_names.is_empty()).then(|| {
                spec.init_containers
                    .iter()
                    .flatten()
                    .map(|c| ContainerStatus {
                        state: Some(waiting("PodInitializing", None)),
                        ..status_of(c)
                    })
                    .collect()
            }),
            container_statuses: Some(spec.containers.iter().map(status_of).collect()),
            ..PodStatus::default()
        };
        Self {
            run,
            reporter,
            status,
            init_names,
            names,
            pod_name_for_ids: String::new(),
        }
    }

    pub(super) fn report(&self) {
        if !self.run.is_deleted() {
            self.reporter.update(self.status.clone());
        }
    }

    fn condition(&mut self, kind: &str, ok: bool, reason: Option<&str>, message: Option<String>) {
        let conditions = self.status.conditions.get_or_insert_with(Vec::new);
        let status = if ok { "True" } else { "False" };
        match conditions.iter_mut().find(|c| c.type_ == kind) {
            Some(condition) => {
                if condition.status != status {
                    condition.last_transition_time = Some(now());
                }
                condition.status = status.to_owned();
                condition.reason = reason.map(str::to_owned);
                condition.message = message;
            }
            None => conditions.push(PodCondition {
                type_: kind.to_owned(),
                status: status.to_owned(),
                reason: reason.map(str::to_owned),
                message,
                last_transition_time: Some(now()),
                ..PodCondition::default()
            }),
        }
        conditions.sort_by_key(|c| CONDITIONS.iter().position(|k| *k == c.type_));
    }

    fn init(&mut self, i: usize) -> &mut ContainerStatus {
        &mut self
            .status
            .init_container_statuses
            .as_mut()
            .expect("the pod has init containers")[i]
    }

    fn main(&mut self, i: usize) -> &mut ContainerStatus {
        &mut self
            .status
            .container_statuses
            .as_mut()
            .expect("the pod has containers")[i]
    }

    pub(super) fn unschedulable(&mut self, message: String) {
        self.condition("PodScheduled", false, Some("Unschedulable"), Some(message));
        self.status.init_container_statuses = None;
        self.status.container_statuses = None;
        self.report();
    }

    pub(super) fn scheduled(&mut self) {
        self.status.start_time = Some(now());
        self.condition("PodScheduled", true, None, None);
        self.condition("PodReadyToStartContainers", false, None, None);
        if !self.init_names.is_empty() {
            let message = format!(
                "containers with incomplete status: [{}]",
                self.init_names.join(" ")
            );
            self.condition(
                "Initialized",
                false,
                Some("ContainersNotInitialized"),
                Some(message),
            );
        } else {
            self.condition("Initialized", true, None, None);
        }
        self.not_ready();
        self.report();
    }

    fn not_ready(&mut self) {
        let unready: Vec<String> = self
            .status
            .container_statuses
            .iter()
            .flatten()
            .filter(|c| !c.ready)
            .map(|c| c.name.clone())
            .collect();
        let message = format!("containers with unready status: [{}]", unready.join(" "));
        for kind in ["Ready", "ContainersReady"] {
            self.condition(
                kind,
                false,
                Some("ContainersNotReady"),
                Some(message.clone()),
            );
        }
    }

    pub(super) fn pull_failed(&mut self, init: bool, name: &str, image: &str) {
        let set = |book: &mut Self, reason: &str, message: String| {
            let statuses = if init {
                book.status.init_container_statuses.as_mut()
            } else {
                book.status.container_statuses.as_mut()
            };
            if let Some(status) = statuses.into_iter().flatten().find(|c| c.name == name) {
                status.state = Some(waiting(reason, Some(message)));
            }
            book.report();
        };
        set(
            self,
            "ErrImagePull",
            format!(
                "failed to pull and unpack image \"{image}\": not found (the simulated \
                 kubelet's unpullable_images)"
            ),
        );
        // A kubelet backs off after the first failure.
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until && !self.run.is_deleted() {
            std::thread::sleep(TICK);
        }
        set(
            self,
            "ImagePullBackOff",
            format!("Back-off pulling image \"{image}\""),
        );
    }

    pub(super) fn sandbox_failed(&mut self, error: &str) {
        for i in 0..self.init_names.len() {
            self.init(i).state = Some(waiting("PodInitializing", Some(error.to_owned())));
        }
        for i in 0..self.names.len() {
            self.main(i).state = Some(waiting("ContainerCreating", Some(error.to_owned())));
        }
        self.status.message = Some(error.to_owned());
        self.report();
    }

    pub(super) fn sandbox_ready(&mut self, network: &Network) {
        self.pod_name_for_ids = network.name.clone();
        self.status.host_ip = Some(network.host_ip.to_string());
        self.status.host_ips = Some(vec![HostIP {
            ip: network.host_ip.to_string(),
        }]);
        self.status.pod_ip = Some(network.pod_ip.to_string());
        self.status.pod_ips = Some(vec![PodIP {
            ip: network.pod_ip.to_string(),
        }]);
        self.condition("PodReadyToStartContainers", true, None, None);
        self.report();
    }

    fn started(&mut self, init: bool, i: usize) {
        let id = container_id(&self.pod_name_for_ids, &self.name_of(init, i));
        let status = if init { self.init(i) } else { self.main(i) };
        status.state = Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(now()),
            }),
            ..ContainerState::default()
        });
        status.started = Some(true);
        status.container_id = Some(id);
        status.image_id = format!("simulated://{}", status.image);
    }

    fn name_of(&self, init: bool, i: usize) -> String {
        if init {
            self.init_names[i].clone()
        } else {
            self.names[i].clone()
        }
    }

    pub(super) fn init_running(&mut self, i: usize) {
        self.started(true, i);
        self.report();
    }

    pub(super) fn init_waiting(&mut self, i: usize, reason: &str, message: String) {
        self.init(i).state = Some(waiting(reason, Some(message)));
        self.report();
    }

    pub(super) fn init_terminated(&mut self, i: usize, mut terminated: ContainerStateTerminated) {
        let status = self.init(i);
        terminated.started_at = status
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.clone());
        terminated.container_id = status.container_id.clone();
        status.ready = terminated.exit_code == 0;
        status.started = Some(false);
        status.state = Some(ContainerState {
            terminated: Some(terminated),
            ..ContainerState::default()
        });
        self.report();
    }

    pub(super) fn init_failed(&mut self, i: usize, restart_never: bool) {
        let pending: Vec<String> = self.init_names[i..].to_vec();
        self.condition(
            "Initialized",
            false,
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                pending.join(" ")
            )),
        );
        if restart_never {
            self.status.phase = Some("Failed".to_owned());
            self.condition("PodReadyToStartContainers", false, None, None);
            for kind in ["Ready", "ContainersReady"] {
                self.condition(kind, false, Some("PodFailed"), None);
            }
        }
        self.report();
    }

    pub(super) fn initialized(&mut self) {
        if !self.init_names.is_empty() {
            self.condition("Initialized", true, None, None);
        }
        for i in 0..self.names.len() {
            self.main(i).state = Some(waiting("ContainerCreating", None));
        }
    }

    pub(super) fn running(&mut self, i: usize, ready: bool) {
        self.started(false, i);
        self.status.phase = Some("Running".to_owned());
        if ready {
            self.ready(i);
        }
    }

    pub(super) fn waiting(&mut self, i: usize, reason: &str, message: String) {
        self.main(i).state = Some(waiting(reason, Some(message)));
    }

    pub(super) fn ready(&mut self, i: usize) {
        self.main(i).ready = true;
        let all = self
            .status
            .container_statuses
            .iter()
            .flatten()
            .all(|c| c.ready);
        if all {
            for kind in ["Ready", "ContainersReady"] {
                self.condition(kind, true, None, None);
            }
        } else {
            self.not_ready();
        }
    }

    pub(super) fn terminated(&mut self, i: usize, mut terminated: ContainerStateTerminated) {
        let status = self.main(i);
        terminated.started_at = status
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.clone());
        terminated.container_id = status.container_id.clone();
        status.ready = false;
        status.started = Some(false);
        status.state = Some(ContainerState {
            terminated: Some(terminated),
            ..ContainerState::default()
        });
        self.not_ready();
    }

    /// Every container has exited: Succeeded when all exited 0, else Failed.
    pub(super) fn completed(&mut self, containers: usize) {
        let all_zero = (0..containers).all(|i| {
            self.main(i)
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        });
        self.status.phase = Some(if all_zero { "Succeeded" } else { "Failed" }.to_owned());
        for kind in ["Ready", "ContainersReady"] {
            self.condition(kind, false, Some("PodCompleted"), None);
        }
        self.condition("PodReadyToStartContainers", false, None, None);
        self.report();
    }
}

pub(super) fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message,
        }),
        ..ContainerState::default()
    }
}

pub(super) fn container_id(pod: &str, container: &str) -> String {
    format!("simulated://{pod}/{container}")
}

pub(super) fn now() -> Time {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Time(
        k8s_openapi::jiff::Timestamp::from_second(i64::try_from(seconds).unwrap_or(0))
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// Guaranteed when every container's CPU and memory requests equal their limits,
/// BestEffort when nothing is requested or limited, else Burstable.
fn qos_class(spec: &PodSpec) -> &'static str {
    let all: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    let nothing = all.iter().all(|c| {
        c.resources.as_ref().is_none_or(|r| {
            r.requests.as_ref().is_none_or(|m| m.is_empty())
                && r.limits.as_ref().is_none_or(|m| m.is_empty())
        })
    });
    if nothing {
        return "BestEffort";
    }
    let guaranteed = all.iter().all(|c| {
        let Some(resources) = &c.resources else {
            return false;
        };
        ["cpu", "memory"].iter().all(|kind| {
            let limit = resources.limits.as_ref().and_then(|l| l.get(*kind));
            let request = resources
                .requests
                .as_ref()
                .and_then(|r| r.get(*kind))
                .or(limit);
            limit.is_some()
                && limit.and_then(|q| quantity_millis(&q.0))
                    == request.and_then(|q| quantity_millis(&q.0))
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The pod's CPU request in thousandths, as the scheduler counts it: the larger of the
/// containers' sum and the largest init container's (a request defaults to the limit).
pub(super) fn requested_cpu_millis(spec: &PodSpec) -> u128 {
    let cpu = |c: &Container| -> u128 {
        let Some(resources) = &c.resources else {
            return 0;
        };
        resources
            .requests
            .as_ref()
            .and_then(|r| r.get("cpu"))
            .or_else(|| resources.limits.as_ref().and_then(|l| l.get("cpu")))
            .and_then(|q| quantity_millis(&q.0))
            .unwrap_or(0)
    };
    let containers: u128 = spec.containers.iter().map(cpu).sum();
    let init = spec.init_containers.iter().flatten().map(cpu).max();
    containers.max(init.unwrap_or(0))
}

/// A Kubernetes quantity (`1500m`, `2`, `256Mi`, `1e3`, `0.5`) in thousandths, rounded up.
pub(super) fn quantity_millis(quantity: &str) -> Option<u128> {
    let quantity = quantity.trim();
    let split = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    let (whole, fraction) = number
        .trim_start_matches('+')
        .split_once('.')
        .unwrap_or((number.trim_start_matches('+'), ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    // value = mantissa / 10^fraction.len() * multiplier; in thousandths.
    let mut numerator = mantissa.checked_mul(1000)?;
    let mut denominator: u128 = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let binary = |power: u32| 1024u128.pow(power);
    let decimal = |power: u32| 10u128.pow(power);
    match suffix {
        "" => {}
        "m" => denominator *= 1000,
        "u" => denominator *= decimal(6),
        "n" => denominator *= decimal(9),
        "k" => numerator = numerator.checked_mul(decimal(3))?,
        "M" => numerator = numerator.checked_mul(decimal(6))?,
        "G" => numerator = numerator.checked_mul(decimal(9))?,
        "T" => numerator = numerator.checked_mul(decimal(12))?,
        "P" => numerator = numerator.checked_mul(decimal(15))?,
        "E" => numerator = numerator.checked_mul(decimal(18))?,
        "Ki" => numerator = numerator.checked_mul(binary(1))?,
        "Mi" => numerator = numerator.checked_mul(binary(2))?,
        "Gi" => numerator = numerator.checked_mul(binary(3))?,
        "Ti" => numerator = numerator.checked_mul(binary(4))?,
        "Pi" => numerator = numerator.checked_mul(binary(5))?,
        "Ei" => numerator = numerator.checked_mul(binary(6))?,
        exponent if exponent.starts_with(['e', 'E']) => {
            let power: i32 = exponent[1..].parse().ok()?;
            if power >= 0 {
                numerator = numerator.checked_mul(10u128.checked_pow(power.unsigned_abs())?)?;
            } else {
                denominator = denominator.checked_mul(10u128.checked_pow(power.unsigned_abs())?)?;
            }
        }
        _ => return None,
    }
    Some(numerator.div_ceil(denominator))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        assert_eq!(quantity_millis("1500m"), Some(1500));
        assert_eq!(quantity_millis("2"), Some(2000));
        assert_eq!(quantity_millis("0.5"), Some(500));
        assert_eq!(quantity_millis("256Mi"), Some(256 * 1024 * 1024 * 1000));
        assert_eq!(quantity_millis("268435456"), Some(268_435_456_000));
        assert_eq!(quantity_millis("1k"), Some(1_000_000));
        assert_eq!(quantity_millis("1e3"), Some(1_000_000));
        assert_eq!(quantity_millis("1.5Gi"), Some(1_610_612_736_000));
        assert_eq!(quantity_millis("1x"), None);
        assert_eq!(quantity_millis(""), None);
    }
}
