//! Requests to the cluster, with the retries Kubernetes says are safe, and its errors turned
//! into warren's.
//!
//! Retried, with exponential backoff (100 ms doubling, at most 5 s apart, for at most
//! [`RETRY_BUDGET`]): 429 TooManyRequests, 500, 502, 503 and 504, and a connection that
//! failed before any answer. kube's own retry layer must be off (`Config::default_retry =
//! false`, as [`client_config`] makes it): its 15 retries growing to 1000 s apart would hold
//! a client's request for minutes; a `Retry-After` is not passed on by kube's error, so the
//! backoff stands in for it. Every request warren makes is safe to repeat:
//! a create that did land answers 409 AlreadyExists on the retry, which the caller treats as
//! "it exists" (and then checks it is exactly what warren makes), and a delete that did land
//! answers 404. Never retried: 403 (the service account lacks a permission: the operator's
//! to fix), 409 Conflict and 422 Invalid (repeating cannot change the answer).

use std::time::Duration;

use kube::Error as KubeError;
use warren_backend::BackendError;
use warren_core::SandboxId;

/// `config` as the backend uses it: kube's own retries off (this module retries, bounded).
pub fn client_config(mut config: kube::Config) -> kube::Config {
    config.default_retry = false;
    config
}

/// How long one operation keeps retrying.
pub(crate) const RETRY_BUDGET: Duration = Duration::from_secs(30);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Whether Kubernetes' answer says the same request may succeed later.
fn retryable(error: &KubeError) -> bool {
    match error {
        KubeError::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        // No answer at all: the connection failed or was cut.
        KubeError::HyperError(_) | KubeError::Service(_) => true,
        _ => false,
    }
}

/// Runs `attempt` until it succeeds, fails in a way that must not be retried, or the
/// budget is spent.
pub(crate) async fn with_retries<T, F, Fut>(mut attempt: F) -> Result<T, KubeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, KubeError>>,
{
    let started = tokio::time::Instant::now();
    let mut backoff = FIRST_BACKOFF;
    loop {
        match attempt().await {
            Err(error) if retryable(&error) && started.elapsed() + backoff < RETRY_BUDGET => {
                tracing::debug!(%error, ?backoff, "retrying a request to the cluster");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            other => return other,
        }
    }
}

/// The HTTP status of a refusal, when the cluster answered one.
pub(crate) fn status_code(error: &KubeError) -> Option<u16> {
    match error {
        KubeError::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Whether the cluster said the object does not exist.
pub(crate) fn is_not_found(error: &KubeError) -> bool {
    status_code(error) == Some(404)
}

/// Whether the cluster said the object exists already.
pub(crate) fn is_already_exists(error: &KubeError) -> bool {
    matches!(error, KubeError::Api(status) if status.code == 409 && status.reason == "AlreadyExists")
}

/// warren's error for a failed request about `sandbox`.
pub(crate) fn failure(
    sandbox: Option<&SandboxId>,
    operation: impl Into<String>,
    error: KubeError,
) -> BackendError {
    let (code, reason, message) = match &error {
        KubeError::Api(status) => (status.code, status.reason.clone(), status.message.clone()),
        other => (0, "NoAnswer".to_owned(), other.to_string()),
    };
    BackendError::Cluster {
        sandbox: sandbox.cloned(),
        operation: operation.into(),
        code,
        reason,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> KubeError {
        KubeError::Api(
            kube::core::Status {
                code,
                reason: reason.into(),
                message: format!("{reason} for a test"),
                ..Default::default()
            }
            .boxed(),
        )
    }

    #[test]
    fn only_overload_outages_and_lost_answers_are_retried() {
        for code in [429, 500, 502, 503, 504] {
            assert!(retryable(&api(code, "x")), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 410, 422] {
            assert!(!retryable(&api(code, "x")), "{code}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retried_request_stops_at_the_first_final_answer() {
        let mut calls = 0;
        let result: Result<(), _> = with_retries(|| {
            calls += 1;
            let answer = match calls {
                1 => Err(api(429, "TooManyRequests")),
                2 => Err(api(503, "ServiceUnavailable")),
                _ => Err(api(403, "Forbidden")),
            };
            async move { answer }
        })
        .await;
        assert_eq!(calls, 3);
        assert_eq!(status_code(&result.unwrap_err()), Some(403));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_end_when_the_budget_is_spent() {
        let started = tokio::time::Instant::now();
        let result: Result<(), _> =
            with_retries(|| async { Err(api(503, "ServiceUnavailable")) }).await;
        assert!(result.is_err());
        assert!(started.elapsed() <= RETRY_BUDGET);
    }

    #[test]
    fn a_refusal_keeps_the_clusters_code_reason_and_message() {
        let sandbox = SandboxId::parse("sbx-0123456789abcdef0123456789abcdef").ok();
        let BackendError::Cluster {
            code,
            reason,
            message,
            operation,
            ..
        } = failure(sandbox.as_ref(), "create the pod", api(403, "Forbidden"))
        else {
            panic!("not a cluster error");
        };
        assert_eq!((code, reason.as_str()), (403, "Forbidden"));
        assert_eq!(message, "Forbidden for a test");
        assert_eq!(operation, "create the pod");
    }
}
