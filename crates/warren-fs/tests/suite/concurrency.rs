//! Concurrent writers (I27): conditional writes, edits and appends never lose an update.

use std::thread;

use warren_fs::{ByteRange, FsError, Resolver, WriteOptions};

use super::support::{host_names, Fixture};

const THREADS: usize = 8;

fn eight_threads_incrementing_with_if_match_lose_no_update(r: Resolver) {
    const INCREMENTS: usize = 50;
    let f = Fixture::new();
    f.file("counter.txt", "0");
    let ws = f.ws(r);
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..INCREMENTS {
                    loop {
                        let current = ws.read("counter.txt", ByteRange::FULL, 64).unwrap();
                        let value: u64 = std::str::from_utf8(&current.bytes)
                            .unwrap()
                            .parse()
                            .unwrap();
                        let opts = WriteOptions {
                            if_match: Some(current.etag),
                            ..Default::default()
                        };
                        match ws.write("counter.txt", (value + 1).to_string().as_bytes(), opts) {
                            Ok(_) => break,
                            Err(FsError::PreconditionFailed { .. }) => continue,
                            Err(e) => panic!("unexpected error: {e:?}"),
                        }
                    }
                }
            });
        }
    });
    assert_eq!(f.read("counter.txt"), (THREADS * INCREMENTS).to_string());
    let names = host_names(&f.root);
    assert_eq!(names, ["counter.txt"], "no temp file left behind");
}

fn concurrent_edits_never_lose_one(r: Resolver) {
    const EDITS: usize = 20;
    let f = Fixture::new();
    f.file("notes.txt", "END\n");
    let ws = f.ws(r);
    thread::scope(|s| {
        for t in 0..THREADS {
            let ws = &ws;
            s.spawn(move || {
                for i in 0..EDITS {
                    ws.edit("notes.txt", "END", &format!("t{t}-{i}\nEND"), false, None)
                        .unwrap();
                }
            });
        }
    });
    let content = f.read("notes.txt");
    assert_eq!(content.lines().count(), THREADS * EDITS + 1);
    for t in 0..THREADS {
        for i in 0..EDITS {
            assert!(content.contains(&format!("t{t}-{i}\n")), "t{t}-{i} lost");
        }
    }
}

fn concurrent_appends_keep_every_record(r: Resolver) {
    const APPENDS: usize = 50;
    let f = Fixture::new();
    let ws = f.ws(r);
    thread::scope(|s| {
        for t in 0..THREADS {
            let ws = &ws;
            s.spawn(move || {
                for i in 0..APPENDS {
                    ws.append(
                        "log.txt",
                        format!("{t}:{i}\n").as_bytes(),
                        WriteOptions::default(),
                    )
                    .unwrap();
                }
            });
        }
    });
    assert_eq!(f.read("log.txt").lines().count(), THREADS * APPENDS);
}

for_both_resolvers!(
    eight_threads_incrementing_with_if_match_lose_no_update,
    concurrent_edits_never_lose_one,
    concurrent_appends_keep_every_record,
);
