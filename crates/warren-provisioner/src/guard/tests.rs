//! The execution guard against its model: a seeded random schedule of acquisitions,
//! renewals, releases, fenced writes and clock steps from several simulated holders, on a
//! SQLite store whose clock the test moves, plus the races the fence gate exists for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use warren_core::SandboxId;
use warren_fs::{ByteRange, WriteOptions};
use warren_store::{ManualClock, SqliteStore};

use super::FenceToken;
use crate::{testing, Provisioner, ProvisionerError};

const FILE: &str = "guarded.txt";

/// A provisioner on a private data directory and an in-memory store run by `clock`, with
/// one sandbox.
struct Fixture {
    provisioner: Arc<Provisioner>,
    sandbox: SandboxId,
    _fixture: testing::Fixture,
}

async fn fixture(clock: ManualClock) -> Fixture {
    let store = SqliteStore::open_in_memory_with_clock(clock).await.unwrap();
    let fixture = testing::Fixture::builder()
        .store(Arc::new(store))
        .build()
        .await;
    let record = fixture.sandbox("alice", "t", "projects/a").await;
    Fixture {
        provisioner: fixture.provisioner.clone(),
        sandbox: record.id,
        _fixture: fixture,
    }
}

fn start() -> ManualClock {
    ManualClock::new(DateTime::from_timestamp_millis(1_700_000_000_000).unwrap())
}

fn now(clock: &ManualClock) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(clock.now_millis()).unwrap()
}

/// xorshift64*: a seeded schedule needs no dependency, and a failing seed replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A fenced write as a transport performs it: the permit, then the write under it.
async fn fenced_write(
    provisioner: &Provisioner,
    sandbox: &SandboxId,
    token: Option<i64>,
    content: &str,
) -> Result<(), ProvisionerError> {
    let token = token.map(FenceToken::new).transpose()?;
    let _permit = provisioner.fence(sandbox, token).await?;
    provisioner
        .write(
            sandbox,
            FILE,
            content.as_bytes().to_vec(),
            WriteOptions::default(),
            false,
        )
        .await
        .map(drop)
}

async fn content(provisioner: &Provisioner, sandbox: &SandboxId) -> Option<String> {
    match provisioner.read(sandbox, FILE, ByteRange::FULL).await {
        Ok(read) => Some(String::from_utf8(read.value.bytes).unwrap()),
        Err(_) => None,
    }
}

/// What the model knows about the one guard that can be live: the newest token issued,
/// who holds it and until when (`None` once released).
#[derive(Debug, Clone)]
struct Issued {
    token: i64,
    holder: usize,
    expires_at: Option<DateTime<Utc>>,
}

#[tokio::test]
async fn a_random_schedule_of_holders_keeps_tokens_rising_one_holder_live_and_stale_writes_out() {
    for seed in [1_u64, 7, 42, 1234, 0x5eed_cafe] {
        run_schedule(seed, 300).await;
    }
}

async fn run_schedule(seed: u64, steps: usize) {
    const HOLDERS: usize = 4;
    let clock = start();
    let f = fixture(clock.clone()).await;
    let (p, sbx) = (&f.provisioner, &f.sandbox);
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // The token each simulated holder believes it has; a paused holder keeps an old one.
    let mut held: [Option<i64>; HOLDERS] = [None; HOLDERS];
    let mut newest: Option<Issued> = None;
    let mut issued_tokens: Vec<i64> = Vec::new();
    let mut accepted: Vec<i64> = Vec::new();
    let mut file: Option<String> = None;
    for step in 0..steps {
        let who = rng.below(HOLDERS as u64) as usize;
        let at = now(&clock);
        let live = newest
            .as_ref()
            .filter(|g| g.expires_at.is_some_and(|e| e > at))
            .cloned();
        let context = format!("seed {seed} step {step} holder {who}");
        match rng.below(6) {
            0 => {
                // TTLs are whole seconds and the clock moves in steps of 700 ms, so no
                // expiry ever falls on the instant it is judged at: the model is exact.
                let ttl = Duration::from_secs(1 + rng.below(5));
                match p.acquire_guard(sbx, &format!("holder-{who}"), ttl).await {
                    Ok(guard) => {
                        assert!(live.is_none(), "{context}: acquired over live {live:?}");
                        assert!(
                            issued_tokens.iter().all(|t| *t < guard.token),
                            "{context}: token {} after {issued_tokens:?}",
                            guard.token
                        );
                        assert_eq!(guard.holder, format!("holder-{who}"), "{context}");
                        assert!(guard.expires_at > at, "{context}");
                        issued_tokens.push(guard.token);
                        held[who] = Some(guard.token);
                        newest = Some(Issued {
                            token: guard.token,
                            holder: who,
                            expires_at: Some(guard.expires_at),
                        });
                    }
                    Err(ProvisionerError::GuardHeld {
                        holder, expires_at, ..
                    }) => {
                        let live = live.unwrap_or_else(|| {
                            panic!("{context}: guard_held by {holder:?} with none live")
                        });
                        assert_eq!(holder, format!("holder-{}", live.holder), "{context}");
                        assert_eq!(Some(expires_at), live.expires_at, "{context}");
                    }
                    Err(other) => panic!("{context}: {other}"),
                }
            }
            1 => {
                let Some(token) = held[who] else { continue };
                let ttl = Duration::from_secs(1 + rng.below(5));
                let renewable = live.as_ref().is_some_and(|g| g.token == token);
                match p.renew_guard(sbx, token, Some(ttl)).await {
                    Ok(guard) => {
                        assert!(renewable, "{context}: renewed {token}, live {live:?}");
                        assert_eq!(guard.token, token, "{context}");
                        assert!(guard.expires_at > at, "{context}");
                        newest.as_mut().unwrap().expires_at = Some(guard.expires_at);
                    }
                    Err(ProvisionerError::GuardNotFound { .. }) => {
                        assert!(!renewable, "{context}: live {token} not renewed");
                    }
                    Err(other) => panic!("{context}: {other}"),
                }
            }
            2 => {
                let Some(token) = held[who] else { continue };
                let releasable = live.as_ref().is_some_and(|g| g.token == token);
                match p.release_guard(sbx, token).await {
                    Ok(()) => {
                        assert!(releasable, "{context}: released {token}, live {live:?}");
                        newest.as_mut().unwrap().expires_at = None;
                    }
                    Err(ProvisionerError::GuardNotFound { .. }) => {
                        assert!(!releasable, "{context}: live {token} not released");
                    }
                    Err(other) => panic!("{context}: {other}"),
                }
            }
            3 | 4 => {
                let Some(token) = held[who] else { continue };
                let text = format!("{who}:{token}:{step}");
                let newest_token = newest.as_ref().map(|g| g.token);
                match fenced_write(p, sbx, Some(token), &text).await {
                    Ok(()) => {
                        // Lapsed or released, the newest token is still accepted: only a
                        // newer holder makes it stale.
                        assert_eq!(Some(token), newest_token, "{context}: accepted");
                        assert!(
                            accepted.iter().all(|t| *t <= token),
                            "{context}: accepted {token} after {accepted:?}"
                        );
                        accepted.push(token);
                        file = Some(text);
                    }
                    Err(ProvisionerError::FenceStale {
                        token: t,
                        newest: n,
                    }) => {
                        assert_eq!((t, Some(n)), (token, newest_token), "{context}");
                        assert!(token < n, "{context}");
                    }
                    Err(other) => panic!("{context}: {other}"),
                }
                // A refused write changed nothing; an accepted one is there whole.
                assert_eq!(content(p, sbx).await, file, "{context}");
            }
            _ => clock.advance(Duration::from_millis(700 * (1 + rng.below(3)))),
        }
        // At most one holder is live, and it is the newest token's.
        let current = p.current_guard(sbx).await.unwrap();
        let at = now(&clock);
        let expected = newest
            .as_ref()
            .filter(|g| g.expires_at.is_some_and(|e| e > at));
        assert_eq!(
            current.as_ref().map(|g| g.token),
            expected.map(|g| g.token),
            "{context}: current guard"
        );
    }
    assert!(
        issued_tokens.windows(2).all(|w| w[0] < w[1]),
        "seed {seed}: {issued_tokens:?}"
    );
    assert!(
        issued_tokens.len() > 3 && accepted.len() > 3,
        "seed {seed}: the schedule exercised too little ({} tokens, {} writes)",
        issued_tokens.len(),
        accepted.len()
    );
    // Every permit went: the gate keeps no entry for an idle sandbox.
    assert_eq!(p.fence_gates.len(), 0);
}

#[tokio::test]
async fn a_lapsed_holder_that_resumes_is_refused_and_its_write_changes_nothing() {
    let clock = start();
    let f = fixture(clock.clone()).await;
    let (p, sbx) = (&f.provisioner, &f.sandbox);
    let first = p
        .acquire_guard(sbx, "replica-a", Duration::from_secs(2))
        .await
        .unwrap();
    fenced_write(p, sbx, Some(first.token), "a").await.unwrap();
    // A is paused past its TTL; B takes over and writes.
    clock.advance(Duration::from_millis(2_001));
    let second = p
        .acquire_guard(sbx, "replica-b", Duration::from_secs(2))
        .await
        .unwrap();
    assert!(second.token > first.token);
    fenced_write(p, sbx, Some(second.token), "b").await.unwrap();
    // A resumes and writes with the token it still believes in.
    match fenced_write(p, sbx, Some(first.token), "a again").await {
        Err(ProvisionerError::FenceStale { token, newest }) => {
            assert_eq!((token, newest), (first.token, second.token));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(content(p, sbx).await.as_deref(), Some("b"));
    // Unfenced writes go on as before guards existed.
    fenced_write(p, sbx, None, "unfenced").await.unwrap();
    assert_eq!(content(p, sbx).await.as_deref(), Some("unfenced"));
    // A renewal of the superseded token is refused too.
    assert!(matches!(
        p.renew_guard(sbx, first.token, Some(Duration::from_secs(2)))
            .await,
        Err(ProvisionerError::GuardNotFound { .. })
    ));
}

#[tokio::test]
async fn an_acquisition_waits_for_a_fenced_write_in_flight_and_a_write_after_it_is_stale() {
    let clock = start();
    let f = fixture(clock.clone()).await;
    let p = f.provisioner.clone();
    let sbx = f.sandbox.clone();
    let first = p
        .acquire_guard(&sbx, "a", Duration::from_secs(1))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(5));
    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let (checked_tx, checked_rx) = tokio::sync::oneshot::channel();
    let writer = {
        let (p, sbx, events) = (p.clone(), sbx.clone(), events.clone());
        tokio::spawn(async move {
            let permit = p
                .fence(&sbx, Some(FenceToken::new(first.token).unwrap()))
                .await
                .unwrap();
            checked_tx.send(()).unwrap();
            // A slow write: the acquisition below must not get its token meanwhile.
            tokio::time::sleep(Duration::from_millis(200)).await;
            events.lock().unwrap().push("write a".into());
            drop(permit);
        })
    };
    checked_rx.await.unwrap();
    let second = p
        .acquire_guard(&sbx, "b", Duration::from_secs(1))
        .await
        .unwrap();
    events
        .lock()
        .unwrap()
        .push(format!("acquired {}", second.token));
    writer.await.unwrap();
    assert_eq!(
        *events.lock().unwrap(),
        ["write a".to_owned(), format!("acquired {}", second.token)]
    );
    assert!(matches!(
        p.fence(&sbx, Some(FenceToken::new(first.token).unwrap()))
            .await,
        Err(ProvisionerError::FenceStale { .. })
    ));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// `acquire_guard` returned this token.
    Issued(i64),
    /// A write fenced with this token finished under its permit.
    Wrote(i64),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_holders_never_get_a_write_in_after_a_newer_token_was_issued() {
    let clock = start();
    let f = fixture(clock.clone()).await;
    let events = Arc::new(Mutex::new(Vec::<Event>::new()));
    let mut tasks = Vec::new();
    for who in 0..4_u64 {
        let (p, sbx, clock, events) = (
            f.provisioner.clone(),
            f.sandbox.clone(),
            clock.clone(),
            events.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0xdead_beef ^ (who + 1));
            let mut mine: Option<i64> = None;
            for _ in 0..150 {
                match rng.below(4) {
                    0 => {
                        if let Ok(guard) = p
                            .acquire_guard(&sbx, &format!("h{who}"), Duration::from_secs(1))
                            .await
                        {
                            events.lock().unwrap().push(Event::Issued(guard.token));
                            mine = Some(guard.token);
                        }
                    }
                    1 => clock.advance(Duration::from_millis(700)),
                    _ => {
                        let Some(token) = mine else { continue };
                        let Ok(permit) = p.fence(&sbx, Some(FenceToken::new(token).unwrap())).await
                        else {
                            continue;
                        };
                        // Widen the window between the check and the end of the write:
                        // without the gate an acquisition would return in here.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        events.lock().unwrap().push(Event::Wrote(token));
                        drop(permit);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let events = events.lock().unwrap();
    let mut newest_issued = 0;
    let mut last_written = 0;
    let mut writes = 0;
    for (at, event) in events.iter().enumerate() {
        match *event {
            Event::Issued(token) => {
                assert!(token > newest_issued, "token {token} at {at}: {events:?}");
                newest_issued = token;
            }
            Event::Wrote(token) => {
                assert!(
                    token >= newest_issued && token >= last_written,
                    "write with {token} at {at} after token {newest_issued} was issued: {events:?}"
                );
                last_written = token;
                writes += 1;
            }
        }
    }
    assert!(writes > 10 && newest_issued > 3, "{events:?}");
    assert_eq!(f.provisioner.fence_gates.len(), 0);
}

#[tokio::test]
async fn guard_requests_are_checked_before_anything_is_stored() {
    let clock = start();
    let f = fixture(clock.clone()).await;
    let (p, sbx) = (&f.provisioner, &f.sandbox);
    for (holder, ttl) in [
        ("", 5),
        ("x\ny", 5),
        (&*"h".repeat(257), 5),
        ("ok", 0),
        ("ok", 3601),
    ] {
        assert!(
            matches!(
                p.acquire_guard(sbx, holder, Duration::from_secs(ttl)).await,
                Err(ProvisionerError::BadRequest(_))
            ),
            "{holder:?} {ttl}"
        );
    }
    // Nothing was issued: the first real token is 1, and a token never issued is invalid.
    assert!(matches!(
        p.fence(sbx, Some(FenceToken::new(1).unwrap())).await,
        Err(ProvisionerError::FenceInvalid { .. })
    ));
    let guard = p
        .acquire_guard(sbx, &"h".repeat(256), Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(guard.token, 1);
    assert!(matches!(
        p.fence(sbx, Some(FenceToken::new(2).unwrap())).await,
        Err(ProvisionerError::FenceInvalid { .. })
    ));
    let unknown = SandboxId::parse("sbx-000000000000000000000000").unwrap();
    assert!(matches!(
        p.fence(&unknown, Some(FenceToken::new(1).unwrap())).await,
        Err(ProvisionerError::SandboxNotFound(_))
    ));
    assert!(matches!(
        p.acquire_guard(&unknown, "h", Duration::from_secs(5)).await,
        Err(ProvisionerError::SandboxNotFound(_))
    ));
}

#[test]
fn fencing_tokens_are_positive_decimal_numbers_only() {
    assert_eq!(FenceToken::parse("1").unwrap().get(), 1);
    assert_eq!(
        FenceToken::parse("9223372036854775807").unwrap().get(),
        i64::MAX
    );
    for bad in [
        "",
        "0",
        "01",
        "-1",
        "+1",
        " 1",
        "1 ",
        "0x1",
        "1.0",
        "9223372036854775808",
        "١",
    ] {
        assert!(FenceToken::parse(bad).is_err(), "{bad:?}");
    }
}
