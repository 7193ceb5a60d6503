//! Reads: ranges, caps, ETags and the kinds of object that are not read.

use warren_fs::{ByteRange, Etag, FsError, Resolver};

use super::support::Fixture;

fn span(start: u64, end_inclusive: Option<u64>) -> ByteRange {
    ByteRange::Span {
        start,
        end_inclusive,
    }
}

fn read_ranges_return_the_requested_bytes_and_the_whole_file_etag(r: Resolver) {
    let f = Fixture::new();
    f.file("f.txt", "0123456789");
    let ws = f.ws(r);
    let whole = Etag::of(b"0123456789");
    // (description, range, expected bytes, expected start)
    let table: &[(&str, ByteRange, &str, u64)] = &[
        ("full", ByteRange::FULL, "0123456789", 0),
        ("middle", span(2, Some(4)), "234", 2),
        ("open-ended", span(7, None), "789", 7),
        ("end clamped", span(8, Some(99)), "89", 8),
        ("single byte", span(0, Some(0)), "0", 0),
        ("suffix", ByteRange::Suffix { len: 3 }, "789", 7),
        (
            "suffix longer than file",
            ByteRange::Suffix { len: 50 },
            "0123456789",
            0,
        ),
    ];
    for (what, range, want, start) in table {
        let got = ws.read("f.txt", *range, 100).unwrap();
        assert_eq!(got.bytes, want.as_bytes(), "{what}");
        assert_eq!(got.range_start, *start, "{what}");
        assert_eq!(got.total_size, 10, "{what}");
        assert_eq!(got.etag, whole, "{what}");
    }
}

fn ranges_outside_the_file_are_not_satisfiable(r: Resolver) {
    let f = Fixture::new();
    f.file("f.txt", "0123456789");
    f.file("empty", "");
    let ws = f.ws(r);
    for range in [span(10, None), span(20, Some(30)), span(5, Some(4))] {
        let err = ws.read("f.txt", range, 100).unwrap_err();
        assert!(
            matches!(err, FsError::RangeNotSatisfiable { size: 10, .. }),
            "{err:?}"
        );
    }
    let empty = ws.read("empty", ByteRange::FULL, 100).unwrap();
    assert!(empty.bytes.is_empty());
    assert_eq!(empty.etag, Etag::of(b""));
}

fn a_span_larger_than_the_cap_is_refused_but_a_small_range_of_a_big_file_is_not(r: Resolver) {
    let f = Fixture::new();
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    f.file("big.bin", &content);
    let ws = f.ws(r);
    let err = ws.read("big.bin", ByteRange::FULL, 1000).unwrap_err();
    assert!(
        matches!(
            err,
            FsError::TooLarge {
                size: 300_000,
                cap: 1000,
                ..
            }
        ),
        "{err:?}"
    );
    // A range across chunk boundaries, with the ETag still of the whole file.
    let got = ws
        .read("big.bin", span(65_000, Some(66_999)), 2000)
        .unwrap();
    assert_eq!(got.bytes, &content[65_000..67_000]);
    assert_eq!(got.etag, Etag::of(&content));
    assert_eq!(ws.etag("big.bin").unwrap(), Etag::of(&content));
    assert_eq!(got.total_size, 300_000);
}

fn cap_applies_to_the_span_not_to_the_file(r: Resolver) {
    let f = Fixture::new();
    f.file("f.txt", "0123456789");
    let ws = f.ws(r);
    assert_eq!(
        ws.read("f.txt", span(0, Some(3)), 4).unwrap().bytes,
        b"0123"
    );
    let err = ws.read("f.txt", span(0, Some(4)), 4).unwrap_err();
    assert!(
        matches!(
            err,
            FsError::TooLarge {
                size: 5,
                cap: 4,
                ..
            }
        ),
        "{err:?}"
    );
}

fn directories_and_fifos_are_not_read(r: Resolver) {
    let f = Fixture::new();
    f.dir("d");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.path("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let ws = f.ws(r);
    let err = ws.read("d", ByteRange::FULL, 10).unwrap_err();
    assert!(matches!(err, FsError::IsADirectory { .. }), "{err:?}");
    let err = ws.read("", ByteRange::FULL, 10).unwrap_err();
    assert!(matches!(err, FsError::IsADirectory { .. }), "{err:?}");
    // Opening the fifo must not block (no writer exists) and it must be refused.
    let err = ws.read("fifo", ByteRange::FULL, 10).unwrap_err();
    assert!(matches!(err, FsError::NotAFile { .. }), "{err:?}");
    let err = ws.etag("fifo").unwrap_err();
    assert!(matches!(err, FsError::NotAFile { .. }), "{err:?}");
}

/// Opening a UNIX socket fails with `ENXIO`, before any `fstat` could say what it is: that
/// is "not a regular file" too, never an internal failure.
fn unix_sockets_are_not_files(r: Resolver) {
    let f = Fixture::new();
    let _listener = std::os::unix::net::UnixListener::bind(f.path("agent.sock")).unwrap();
    let ws = f.ws(r);
    let err = ws.read("agent.sock", ByteRange::FULL, 10).unwrap_err();
    assert!(matches!(err, FsError::NotAFile { .. }), "{err:?}");
    let err = ws.etag("agent.sock").unwrap_err();
    assert!(matches!(err, FsError::NotAFile { .. }), "{err:?}");
}

fn missing_files_are_not_found(r: Resolver) {
    let f = Fixture::new();
    let err = f
        .ws(r)
        .read("missing.txt", ByteRange::FULL, 10)
        .unwrap_err();
    assert!(matches!(err, FsError::NotFound { .. }), "{err:?}");
}

/// A ranged read of a file already hashed reads only the range and reports the same ETag;
/// any change to the file (in place or replaced) gives the new content's ETag.
fn ranged_reads_reuse_a_known_etag_and_notice_every_change(r: Resolver) {
    let f = Fixture::new();
    let content: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(f.path("big.bin"), &content).unwrap();
    let ws = f.ws(r);
    let full = ws.read("big.bin", ByteRange::FULL, u64::MAX).unwrap();
    assert_eq!(full.etag, Etag::of(&content));
    let range = ws
        .read("big.bin", span(100_000, Some(100_009)), 1024)
        .unwrap();
    assert_eq!(range.etag, full.etag);
    assert_eq!(range.bytes, content[100_000..100_010]);
    assert_eq!(range.total_size, content.len() as u64);
    // Changed in place, same inode, same size.
    let mut changed = content.clone();
    changed[0] ^= 0xff;
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(f.path("big.bin"), &changed).unwrap();
    let after = ws.read("big.bin", span(0, Some(3)), 1024).unwrap();
    assert_eq!(after.etag, Etag::of(&changed));
    assert_eq!(after.bytes, changed[..4]);
}

for_both_resolvers!(
    ranged_reads_reuse_a_known_etag_and_notice_every_change,
    read_ranges_return_the_requested_bytes_and_the_whole_file_etag,
    ranges_outside_the_file_are_not_satisfiable,
    a_span_larger_than_the_cap_is_refused_but_a_small_range_of_a_big_file_is_not,
    cap_applies_to_the_span_not_to_the_file,
    directories_and_fifos_are_not_read,
    unix_sockets_are_not_files,
    missing_files_are_not_found,
);
