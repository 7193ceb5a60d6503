//! The execution guard (I33): one executor at a time may change a sandbox, and warren
//! itself — the resource — refuses a change fenced with a token older than the newest
//! issued.
//!
//! The store keeps the lease row and the token counter (`StateStore::acquire_guard` and
//! friends, expiry by the store's clock, never extended by the server). What this module
//! adds is the *fence gate*: a per-sandbox async read/write lock. A fenced mutation takes
//! the read side, asks the store whether its token is still the newest, and performs its
//! write while still holding it ([`FencePermit`]); an acquisition takes the write side
//! around issuing the new token. So the check and the write are one critical section with
//! respect to acquisitions: once `acquire_guard` has returned token N+1, every write that
//! was accepted with N has finished, and every later write carrying N is refused
//! (`fence_stale`). There is no window between "token is current" and "write done" in
//! which a newer token can appear.
//!
//! The gate lives in this process: it is exact for one warren server. Where several
//! replicas share a PostgreSQL store (cluster mode, issue 14) the store takes the same
//! decision across processes: `hold_fence` keeps the guard row locked `FOR SHARE` in a
//! transaction for as long as the permit is held, and an acquisition's upsert of that row
//! waits for it (the permit's `store_hold`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use warren_core::SandboxId;
use warren_store::{FenceCheck, Guard, GuardAcquire, StoreError};

use crate::{Provisioner, ProvisionerError};

/// Longest guard a holder may take at once; it renews for longer.
pub const MAX_GUARD_TTL: Duration = Duration::from_secs(3600);
/// Longest holder name, in bytes.
pub const MAX_GUARD_HOLDER_BYTES: usize = 256;

/// A fencing token as a client sent it (`X-Warren-Fence`): a positive whole number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceToken(i64);

impl FenceToken {
    /// Reads a token: decimal digits only (no sign, spaces or leading zero), 1 to 2^63-1.
    /// Anything else is 400 `fence_invalid`: a malformed token must never be mistaken for
    /// no token.
    pub fn parse(raw: &str) -> Result<Self, ProvisionerError> {
        let invalid = || {
            ProvisionerError::FenceInvalid {
            reason: format!(
                "the fencing token {:?} is not a positive whole number; send the token the guard acquisition returned",
                raw.chars().take(40).collect::<String>()
            ),
        }
        };
        if raw.starts_with('0') || raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        match raw.parse::<i64>() {
            Ok(token) if token >= 1 => Ok(Self(token)),
            _ => Err(invalid()),
        }
    }

    /// A token from a number; zero and negatives are refused as never issued.
    pub fn new(token: i64) -> Result<Self, ProvisionerError> {
        if token >= 1 {
            Ok(Self(token))
        } else {
            Err(ProvisionerError::FenceInvalid {
                reason: format!("fencing token {token} was never issued: tokens start at 1"),
            })
        }
    }

    /// The number.
    pub fn get(self) -> i64 {
        self.0
    }

    /// The token a request carries in its [`FENCE_HEADER`] values (HTTP and MCP alike):
    /// `None` without the header, 400 `fence_invalid` for more than one value or one that
    /// is not a token.
    pub fn from_header_values<'a>(
        mut values: impl Iterator<Item = &'a [u8]>,
    ) -> Result<Option<Self>, ProvisionerError> {
        let Some(value) = values.next() else {
            return Ok(None);
        };
        let invalid = |reason: &str| ProvisionerError::FenceInvalid {
            reason: reason.to_owned(),
        };
        if values.next().is_some() {
            return Err(invalid(
                "send one X-Warren-Fence header: the token of the guard you hold",
            ));
        }
        let raw = std::str::from_utf8(value)
            .map_err(|_| invalid("the X-Warren-Fence header is not a positive whole number"))?;
        Self::parse(raw).map(Some)
    }
}

/// The request header carrying an execution guard's fencing token, lowercase as HTTP/2
/// sends it.
pub const FENCE_HEADER: &str = "x-warren-fence";

impl std::fmt::Display for FenceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The per-sandbox locks of the fence gate. Entries exist only while someone holds or
/// waits for them, so the map does not grow with every sandbox ever fenced.
#[derive(Default)]
pub(crate) struct FenceGates {
    locks: Mutex<HashMap<SandboxId, Arc<RwLock<()>>>>,
}

impl FenceGates {
    fn lock_of(&self, sandbox: &SandboxId) -> Arc<RwLock<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(sandbox.clone()).or_default().clone()
    }

    /// Removes the sandbox's entry when nobody but the map has it. Clones are only made
    /// under the map's mutex, which this holds, so no holder or waiter can appear between
    /// the count and the removal.
    fn forget_if_unused(&self, sandbox: &SandboxId) {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        if locks
            .get(sandbox)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            locks.remove(sandbox);
        }
    }

    async fn read(self: &Arc<Self>, sandbox: &SandboxId) -> GateHold<OwnedRwLockReadGuard<()>> {
        let lock = self.lock_of(sandbox);
        GateHold {
            guard: Some(lock.read_owned().await),
            gates: self.clone(),
            sandbox: sandbox.clone(),
        }
    }

    async fn write(self: &Arc<Self>, sandbox: &SandboxId) -> GateHold<OwnedRwLockWriteGuard<()>> {
        let lock = self.lock_of(sandbox);
        GateHold {
            guard: Some(lock.write_owned().await),
            gates: self.clone(),
            sandbox: sandbox.clone(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One side of a sandbox's gate, held; the map entry goes when the last holder leaves.
struct GateHold<G> {
    guard: Option<G>,
    gates: Arc<FenceGates>,
    sandbox: SandboxId,
}

impl<G> Drop for GateHold<G> {
    fn drop(&mut self) {
        // The lock first, so its Arc no longer counts.
        drop(self.guard.take());
        self.gates.forget_if_unused(&self.sandbox);
    }
}

/// Permission to perform one mutation of a sandbox. Hold it until the mutation is done:
/// while a fenced permit is held, no newer guard token can be issued for the sandbox, so
/// the write it covers cannot land after a newer holder took over.
///
/// An unfenced permit (no `X-Warren-Fence`) holds nothing: requests without a token
/// behave as they did before guards existed.
#[must_use = "the mutation is fenced only while the permit is held"]
pub struct FencePermit {
    /// The store's hold, where other processes issue tokens too (PostgreSQL replicas).
    /// Fields drop in order: this one goes first, then the gate.
    _store_hold: Option<warren_store::FenceHold>,
    hold: Option<GateHold<OwnedRwLockReadGuard<()>>>,
    token: Option<FenceToken>,
}

impl FencePermit {
    /// The permit of an unfenced request: holds nothing.
    pub fn unfenced() -> Self {
        Self {
            hold: None,
            _store_hold: None,
            token: None,
        }
    }

    /// The token it was granted for, if the request was fenced.
    pub fn token(&self) -> Option<FenceToken> {
        self.token
    }

    /// Whether it holds the gate.
    pub fn is_fenced(&self) -> bool {
        self.hold.is_some()
    }
}

impl std::fmt::Debug for FencePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencePermit")
            .field("token", &self.token)
            .finish()
    }
}

impl Provisioner {
    /// Admits one mutation of `sandbox`. Without a token the permit is unfenced and the
    /// request goes on as before. With one, the gate's read side is taken and the store
    /// asked whether the token is the newest issued: a newer one is 409 `fence_stale`
    /// (nothing happens), one never issued 400 `fence_invalid`. A token whose guard lapsed
    /// but that nobody superseded is still accepted: only a newer holder makes it stale.
    ///
    /// The caller performs its mutation while holding the returned permit; for an exec the
    /// acceptance point is the start of the command (see [`Provisioner::exec_fenced`]).
    pub async fn fence(
        &self,
        sandbox: &SandboxId,
        token: Option<FenceToken>,
    ) -> Result<FencePermit, ProvisionerError> {
        let Some(token) = token else {
            return Ok(FencePermit::unfenced());
        };
        let hold = self.fence_gates.read(sandbox).await;
        match self.store.hold_fence(sandbox, token.get()).await {
            Ok((FenceCheck::Current, store_hold)) => Ok(FencePermit {
                hold: Some(hold),
                _store_hold: store_hold,
                token: Some(token),
            }),
            Ok((FenceCheck::Stale { newest }, _)) => {
                self.metrics.fence_refused();
                Err(ProvisionerError::FenceStale {
                    token: token.get(),
                    newest,
                })
            }
            Ok((FenceCheck::Unknown { newest }, _)) => {
                // An unknown sandbox is 404 like everywhere else, not a token problem.
                self.sandbox(sandbox).await?;
                Err(ProvisionerError::FenceInvalid {
                    reason: match newest {
                        Some(newest) => format!(
                            "fencing token {token} was never issued for sandbox {sandbox} (the newest is {newest})"
                        ),
                        None => format!(
                            "fencing token {token} was never issued: sandbox {sandbox} has no guard yet"
                        ),
                    },
                })
            }
            Err(StoreError::UnknownSandbox { .. }) => {
                Err(ProvisionerError::SandboxNotFound(sandbox.clone()))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Takes the sandbox's execution guard for `holder`, live for `ttl` (1 s to 1 h) by the
    /// store's clock. While another holder's guard is live: 409 `guard_held`, naming it.
    /// The new token is larger than every token issued before for this sandbox, across
    /// generations; issuing it waits for fenced mutations in flight to finish.
    pub async fn acquire_guard(
        &self,
        sandbox: &SandboxId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Guard, ProvisionerError> {
        check_guard_request(Some(holder), ttl)?;
        self.sandbox(sandbox).await?;
        // The write side: every write accepted with the old token is done before the new
        // token exists, and none with the old token is accepted after.
        let _exclusive = self.fence_gates.write(sandbox).await;
        match self.store.acquire_guard(sandbox, holder, ttl).await {
            Ok(GuardAcquire::Acquired(guard)) => Ok(guard),
            Ok(GuardAcquire::Held(current)) => Err(ProvisionerError::GuardHeld {
                sandbox: sandbox.clone(),
                holder: current.holder,
                expires_at: current.expires_at,
            }),
            Err(StoreError::UnknownSandbox { .. }) => {
                Err(ProvisionerError::SandboxNotFound(sandbox.clone()))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Extends the live guard `token` to `ttl` from now. A token that is not the live guard
    /// (released, lapsed, superseded, never issued) is 404 `guard_not_found`: its holder
    /// must acquire again and will get a new token. Renewal does not change the token, so
    /// it needs no gate.
    pub async fn renew_guard(
        &self,
        sandbox: &SandboxId,
        token: i64,
        ttl: Option<Duration>,
    ) -> Result<Guard, ProvisionerError> {
        if let Some(ttl) = ttl {
            check_guard_request(None, ttl)?;
        }
        self.sandbox(sandbox).await?;
        self.store
            .renew_guard(sandbox, token, ttl)
            .await?
            .ok_or(ProvisionerError::GuardNotFound { token })
    }

    /// Lets the live guard `token` lapse now, so the next holder need not wait out its TTL.
    /// The token stays the newest until someone acquires: a write carrying it is still
    /// accepted until then, as after a lapse.
    pub async fn release_guard(
        &self,
        sandbox: &SandboxId,
        token: i64,
    ) -> Result<(), ProvisionerError> {
        self.sandbox(sandbox).await?;
        if self.store.release_guard(sandbox, token).await? {
            Ok(())
        } else {
            Err(ProvisionerError::GuardNotFound { token })
        }
    }

    /// The sandbox's live guard, if any.
    pub async fn current_guard(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<Guard>, ProvisionerError> {
        self.sandbox(sandbox).await?;
        Ok(self.store.current_guard(sandbox).await?)
    }
}

/// A holder names itself with 1 to 256 bytes of printable text (it shows in other
/// holders' `guard_held` answers and in logs); a TTL is 1 s to 1 h.
fn check_guard_request(holder: Option<&str>, ttl: Duration) -> Result<(), ProvisionerError> {
    if let Some(holder) = holder {
        if holder.is_empty()
            || holder.len() > MAX_GUARD_HOLDER_BYTES
            || holder.chars().any(char::is_control)
        {
            return Err(ProvisionerError::BadRequest(
                "holder must be 1 to 256 bytes of printable text (a run or replica id)",
            ));
        }
    }
    if ttl < Duration::from_secs(1) || ttl > MAX_GUARD_TTL {
        return Err(ProvisionerError::BadRequest(
            "ttl_s must be between 1 and 3600 seconds; renew at a third of it to hold longer",
        ));
    }
    Ok(())
}

/// For messages: when a guard lapses.
pub(crate) fn rfc3339(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests;
