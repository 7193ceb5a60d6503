//! Generated workloads for benchmarks: the same tree on every run, so figures compare.

use std::path::{Path, PathBuf};

/// Deterministic pseudo-random bytes (xorshift), so every run generates the same tree.
pub struct Noise(pub u64);

impl Noise {
    /// Fills `buf` with the next bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let bytes = self.0.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// A workspace of about `size` bytes: a source tree (many small, compressible files), a
/// virtualenv-like tree (many small modules and a few shared objects) and binaries.
pub fn generate_workspace(dir: &Path, size: u64) -> Vec<PathBuf> {
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let mut files = Vec::new();
    let mut written = 0u64;
    let words = [
        "fn", "let", "match", "return", "self", "impl", "struct", "pub", "use", "mod",
    ];
    let mut n = 0usize;
    while written < size {
        n += 1;
        let (path, bytes): (PathBuf, Vec<u8>) = match n % 10 {
            0..=5 => {
                let mut text = String::new();
                let lines = 20 + (n % 200);
                for line in 0..lines {
                    let word = words[(n + line) % words.len()];
                    text.push_str(&format!(
                        "    {word} item_{n}_{line} = value({line}, {n});\n"
                    ));
                }
                (
                    dir.join(format!("src/mod{}/file{n}.rs", n % 97)),
                    text.into_bytes(),
                )
            }
            6..=8 => {
                let mut text = format!("# module {n}\nimport os\n");
                for line in 0..(10 + n % 60) {
                    text.push_str(&format!("def f_{line}(x):\n    return x * {line} + {n}\n"));
                }
                (
                    dir.join(format!("venv/lib/site-packages/pkg{}/m{n}.py", n % 53)),
                    text.into_bytes(),
                )
            }
            _ => {
                let len = 256 * 1024 + (n % 7) * 512 * 1024;
                let mut bytes = vec![0u8; len];
                noise.fill(&mut bytes);
                let place = if n % 20 == 9 { "venv/lib" } else { "bin" };
                (dir.join(format!("{place}/blob{n}.so")), bytes)
            }
        };
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        written += bytes.len() as u64;
        std::fs::write(&path, bytes).unwrap();
        files.push(path);
    }
    files
}

/// Runs `script` with `sh -c`, failing loudly; how long it took.
pub fn sh(script: &str) -> std::time::Duration {
    let started = std::time::Instant::now();
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .status()
        .expect("sh");
    assert!(status.success(), "{script}");
    started.elapsed()
}

/// The anchor of a full snapshot: `tar | zstd -1` of `dir` into `out`, made durable with
/// `sync -f` as warren's snapshots are; how long it took.
pub fn tar_zstd(dir: &Path, out: &Path) -> std::time::Duration {
    sh(&format!(
        "tar -cf - -C {} . | zstd -1 -q -T1 -f -o {} && sync -f {}",
        dir.display(),
        out.display(),
        out.display()
    ))
}
