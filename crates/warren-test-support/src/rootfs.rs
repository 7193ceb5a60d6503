//! A tiny root filesystem for image tests, where no registry is reachable.

/// A tiny root filesystem as a tar archive: the host's `sh` (dash), `true` and `sleep` with
/// the libraries they link, plus any extra `(path, content)` files. For image tests and the
/// docker anchor of the benchmark, where no registry is reachable.
pub fn minimal_rootfs_tar(extra: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (inside, host) in [
        ("bin/sh", "/bin/dash"),
        ("bin/true", "/bin/true"),
        ("bin/sleep", "/bin/sleep"),
        (
            "lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libc.so.6",
        ),
        ("lib64/ld-linux-x86-64.so.2", "/lib64/ld-linux-x86-64.so.2"),
    ] {
        let bytes = std::fs::read(host).unwrap_or_else(|e| panic!("{host}: {e}"));
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        header.set_size(bytes.len() as u64);
        builder
            .append_data(&mut header, inside, &bytes[..])
            .unwrap();
    }
    for (path, content) in extra {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(content.len() as u64);
        builder.append_data(&mut header, path, *content).unwrap();
    }
    builder.into_inner().unwrap()
}
