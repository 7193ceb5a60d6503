//! Carrying a proxied connection both ways, counting its bytes, and refusing a placeholder
//! the sandbox sends where it may not go (issue 38).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How a splice ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Carried {
    /// Bytes the sandbox sent.
    pub out: u64,
    /// Bytes it received.
    pub r#in: u64,
    /// The forbidden text found in what the sandbox sent (the connection was cut there,
    /// before a byte of it went on).
    pub forbidden: Option<usize>,
}

/// Copies both ways until both sides are done, or nothing moved for `idle` (an idle tunnel
/// would otherwise hold one of the runtime's few connection permits for ever). `first` is
/// what the client sent already, carried first.
///
/// What `client` sends is searched for every text in `forbidden`, across read boundaries:
/// the read that would complete one is not forwarded, and the connection ends there, so
/// no forbidden text ever leaves whole. Nothing is held back (a small message must reach
/// the far side before its answer comes), so a prefix of one may have left.
pub(super) async fn splice<A, B>(
    client: A,
    target: B,
    idle: Duration,
    forbidden: &[String],
    first: Vec<u8>,
) -> std::io::Result<Carried>
where
    A: AsyncRead + AsyncWrite,
    B: AsyncRead + AsyncWrite,
{
    let (mut a_read, mut a_write) = tokio::io::split(client);
    let (mut b_read, mut b_write) = tokio::io::split(target);
    let finder = Finder::new(forbidden);
    let (mut a_buf, mut b_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    // The last bytes the client sent, where a forbidden text may have begun.
    let mut window: Vec<u8> = Vec::new();
    let mut carried = Carried::default();
    if !first.is_empty() {
        if let Some(found) = finder.scan(&mut window, &first) {
            carried.forbidden = Some(found);
            return Ok(carried);
        }
        b_write.write_all(&first).await?;
        carried.out += first.len() as u64;
    }
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        tokio::select! {
            // A side that fails to read is done (a TLS peer gone without close_notify):
            // what was carried until then still counts.
            read = a_read.read(&mut a_buf), if a_open => match read.unwrap_or(0) {
                0 => {
                    a_open = false;
                    let _ = b_write.shutdown().await;
                }
                n => {
                    if let Some(found) = finder.scan(&mut window, &a_buf[..n]) {
                        carried.forbidden = Some(found);
                        return Ok(carried);
                    }
                    if b_write.write_all(&a_buf[..n]).await.is_err() {
                        return Ok(carried);
                    }
                    carried.out += n as u64;
                }
            },
            read = b_read.read(&mut b_buf), if b_open => match read.unwrap_or(0) {
                0 => {
                    b_open = false;
                    let _ = a_write.shutdown().await;
                }
                n => {
                    if a_write.write_all(&b_buf[..n]).await.is_err() {
                        return Ok(carried);
                    }
                    carried.r#in += n as u64;
                }
            },
            () = tokio::time::sleep(idle) => return Ok(carried),
        }
    }
    Ok(carried)
}

/// Finds any of a few texts in a stream, across the chunks it arrives in.
pub(super) struct Finder {
    matcher: Option<aho_corasick::AhoCorasick>,
    longest: usize,
}

impl Finder {
    pub fn new(texts: &[String]) -> Self {
        let texts: Vec<&String> = texts.iter().filter(|t| !t.is_empty()).collect();
        Self {
            matcher: (!texts.is_empty())
                .then(|| aho_corasick::AhoCorasick::new(&texts).ok())
                .flatten(),
            longest: texts.iter().map(|t| t.len()).max().unwrap_or(0),
        }
    }

    /// The index of a text found in `window` followed by `chunk`; the window then keeps
    /// the chunk's last bytes, where the next chunk's text may begin.
    pub fn scan(&self, window: &mut Vec<u8>, chunk: &[u8]) -> Option<usize> {
        let matcher = self.matcher.as_ref()?;
        window.extend_from_slice(chunk);
        let found = matcher.find(&window[..]).map(|m| m.pattern().as_usize());
        let keep = self.longest.saturating_sub(1);
        if window.len() > keep {
            window.drain(..window.len() - keep);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (near, accepted) = tokio::join!(
            async { TcpStream::connect(address).await.unwrap() },
            async { listener.accept().await.unwrap().0 }
        );
        (near, accepted)
    }

    #[tokio::test]
    async fn a_tunnel_carries_both_ways_counts_and_closes_when_idle() {
        let (mut near, accepted) = pair().await;
        let (mut far, far_accepted) = pair().await;
        let splicer = tokio::spawn(async move {
            let started = std::time::Instant::now();
            let carried = splice(
                accepted,
                far_accepted,
                Duration::from_millis(300),
                &[],
                Vec::new(),
            )
            .await
            .unwrap();
            (started.elapsed(), carried)
        });
        near.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        far.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        far.write_all(b"pong!").await.unwrap();
        let mut buf = [0u8; 5];
        near.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong!");
        // Then silence: the splice ends by itself after the idle time.
        let (lasted, carried) = tokio::time::timeout(Duration::from_secs(5), splicer)
            .await
            .unwrap()
            .unwrap();
        assert!(lasted >= Duration::from_millis(300), "{lasted:?}");
        assert_eq!((carried.out, carried.r#in), (4, 5));
    }

    #[tokio::test]
    async fn a_forbidden_text_split_across_writes_never_leaves() {
        let (mut near, accepted) = pair().await;
        let (mut far, far_accepted) = pair().await;
        let forbidden = vec!["warren-secret-0123456789".to_owned()];
        let splicer = tokio::spawn(async move {
            splice(
                accepted,
                far_accepted,
                Duration::from_secs(5),
                &forbidden,
                Vec::new(),
            )
            .await
            .unwrap()
        });
        near.write_all(b"key=warren-secr").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        near.write_all(b"et-0123456789&rest").await.unwrap();
        let carried = tokio::time::timeout(Duration::from_secs(5), splicer)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(carried.forbidden, Some(0));
        drop(near);
        let mut received = Vec::new();
        far.read_to_end(&mut received).await.unwrap();
        let received = String::from_utf8_lossy(&received);
        // The first write went on (nothing is held back); the one completing it did not.
        assert_eq!(received, "key=warren-secr");
    }

    #[tokio::test]
    async fn a_small_message_goes_on_before_its_answer_comes() {
        let (mut near, accepted) = pair().await;
        let (mut far, far_accepted) = pair().await;
        let forbidden = vec!["warren-secret-0123456789".to_owned()];
        let splicer = tokio::spawn(async move {
            splice(
                accepted,
                far_accepted,
                Duration::from_secs(5),
                &forbidden,
                Vec::new(),
            )
            .await
            .unwrap()
        });
        near.write_all(b"PING\r\n").await.unwrap();
        let mut received = [0u8; 6];
        tokio::time::timeout(Duration::from_secs(5), far.read_exact(&mut received))
            .await
            .expect("the message was held back")
            .unwrap();
        assert_eq!(&received, b"PING\r\n");
        drop((near, far));
        let carried = splicer.await.unwrap();
        assert_eq!((carried.out, carried.forbidden), (6, None));
    }
}
