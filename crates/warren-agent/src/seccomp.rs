//! The seccomp filter every command in a runtime runs under.
//!
//! # What it denies, and why a deny list
//!
//! Commands already run as 1000:1000, without capabilities, under `no_new_privs`, inside
//! their own namespaces and Landlock rules. Most privileged system calls fail there anyway.
//! The filter exists for what those layers leave open: syscalls an unprivileged process may
//! still make that open kernel attack surface (user namespaces, io_uring, eBPF,
//! userfaultfd, perf), reach other processes (ptrace, `process_vm_*`), or change how the
//! sandbox is assembled (mounts, namespaces). Each of those is a short, named set.
//!
//! An allow list would instead have to name every syscall of every compiler, interpreter,
//! database and browser an agent might run, across libc versions, and a missing entry breaks
//! a tool in ways that are hard to diagnose. So the filter allows by default and denies the
//! named set, like Docker's default profile in spirit, but stricter about namespaces and
//! mounts: those are warren's job, never the agent's.
//!
//! A deny list has known holes, closed here:
//!
//! - **Other ABIs.** Every compiled filter starts with seccompiler's architecture check,
//!   which kills the process on a syscall from another ABI (i386 `int 0x80` on x86_64,
//!   AArch32 on aarch64), whose syscall numbers the list does not describe.
//! - **x32.** x32 syscalls report the x86_64 architecture with `__X32_SYSCALL_BIT` set in
//!   the number, so they would slip past a list of x86_64 numbers. On x86_64 the ENOSYS
//!   filter starts with a three-instruction guard answering ENOSYS to any such number
//!   (which is what a kernel without x32 answers anyway).
//! - **`clone3`.** Its flags sit in a struct behind a pointer, which seccomp cannot read,
//!   so it fails with ENOSYS: glibc then falls back to `clone(2)`, whose flags the filter
//!   checks for every `CLONE_NEW*` bit.
//! - **Truncated arguments.** The kernel reads `ioctl` requests, `personality` and the
//!   `clone` flags as 32-bit values, so the policy compares only the low 32 bits
//!   (`"type": "dword"`); setting high bits does not dodge a rule.
//!
//! # The policy file
//!
//! The policy is reviewed data, `policy/seccomp.json` in seccompiler's JSON format, embedded
//! in the binary ([`POLICY_JSON`]) and compiled at runtime for the machine's architecture.
//! `policy/README.md` explains each group; every rule carries a `comment`. Its top-level
//! keys are:
//!
//! - `runtime`: the deny list, EPERM on match, for every architecture;
//! - `runtime@<arch>` (e.g. `runtime@x86_64`): rules merged into `runtime` when compiling
//!   for that architecture only, for syscalls other architectures lack (`iopl`, `ioperm`,
//!   `uselib`); ignored elsewhere, so those names never break another architecture's build.
//!   Unknown names in any section fail compilation: a typo is an error, never a gap;
//! - `runtime_eafnosupport`: `socket` and `socketpair` for any family but `AF_UNIX`,
//!   `AF_INET`, `AF_INET6` and `AF_NETLINK`, and netlink for any protocol but routes,
//!   socket diagnostics and generic netlink, EAFNOSUPPORT on match: what a kernel without
//!   the family answers, which tools already handle. vsock above all, since network
//!   namespaces do not confine it and on a VM it reaches the hypervisor; and netlink's
//!   uevents, which carry the host's device events into a runtime started as root.
//!   (`socketcall`, the other way to make a socket, exists only for i386, whose ABI the
//!   architecture check kills; x32 numbers get ENOSYS.)
//! - `runtime_enosys`: `clone3`, ENOSYS on match.
//!
//! seccompiler gives one filter a single match action, so EPERM, EAFNOSUPPORT and ENOSYS
//! need three filters. [`SeccompProgram::apply`] installs all; the kernel runs every
//! installed filter and keeps the most restrictive answer, and no syscall is matched by two.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use seccompiler::{sock_filter, BpfProgram, TargetArch};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The reviewed policy, `policy/seccomp.json`, as compiled into the binary.
pub const POLICY_JSON: &str = include_str!("../policy/seccomp.json");

/// The deny list: EPERM on match.
const DENY_FILTER: &str = "runtime";
/// Socket families a sandbox does not get: EAFNOSUPPORT on match.
const FAMILY_FILTER: &str = "runtime_eafnosupport";
/// Syscalls that must look unimplemented: ENOSYS on match.
const ENOSYS_FILTER: &str = "runtime_enosys";
/// Every filter the policy may define.
const FILTERS: [&str; 3] = [DENY_FILTER, FAMILY_FILTER, ENOSYS_FILTER];
/// Architectures the policy is written and tested for (names as in `std::env::consts::ARCH`).
const SUPPORTED_ARCHES: [&str; 2] = ["x86_64", "aarch64"];

/// `__X32_SYSCALL_BIT`: set in the number of every x32 syscall.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// Offset of `nr` in `struct seccomp_data`.
const SECCOMP_DATA_NR_OFFSET: u32 = 0;
// Classic BPF opcodes for the x32 guard; the kernel's values are 16 bits wide.
const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// Failures to build or install the runtime seccomp filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The embedded policy is not valid JSON.
    #[error("the seccomp policy is not valid json")]
    Parse(#[source] serde_json::Error),
    /// The embedded policy breaks the layout this module relies on.
    #[error("the seccomp policy is malformed: {reason}")]
    InvalidPolicy {
        /// What is wrong with it.
        reason: String,
    },
    /// seccompiler refused the policy: an unknown syscall name, a bad condition, too long.
    #[error("the seccomp policy does not compile for {arch}")]
    Compile {
        /// The architecture it was compiled for.
        arch: String,
        /// What seccompiler said.
        #[source]
        source: seccompiler::Error,
    },
    /// The policy is not written for this machine's architecture.
    #[error("seccomp filtering is not supported on {arch}")]
    UnsupportedArch {
        /// The architecture, as `std::env::consts::ARCH` names it.
        arch: String,
    },
    /// The kernel refused to install a filter.
    #[error("the seccomp filter cannot be installed")]
    Apply(#[source] seccompiler::Error),
}

/// The runtime policy compiled for one architecture: cheap to clone, ready to install.
#[derive(Clone)]
pub struct SeccompProgram {
    /// BPF programs in installation order: the EPERM deny list, the EAFNOSUPPORT family
    /// filter, then the ENOSYS filter.
    filters: Arc<[BpfProgram]>,
}

impl fmt::Debug for SeccompProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lengths: Vec<usize> = self.filters.iter().map(Vec::len).collect();
        f.debug_struct("SeccompProgram")
            .field("instructions", &lengths)
            .finish()
    }
}

impl SeccompProgram {
    /// Compiles the embedded runtime policy for this machine's architecture.
    pub fn runtime_policy() -> Result<Self, SeccompError> {
        Self::for_arch(std::env::consts::ARCH)
    }

    /// Compiles the embedded runtime policy for `arch` (named as `std::env::consts::ARCH`
    /// names it), which need not be this machine's.
    fn for_arch(arch: &str) -> Result<Self, SeccompError> {
        let target = target_arch(arch)?;
        let policy = Value::Object(select_filters(arch)?).to_string();
        let mut compiled =
            seccompiler::compile_from_json(policy.as_bytes(), target).map_err(|source| {
                SeccompError::Compile {
                    arch: arch.to_owned(),
                    source,
                }
            })?;
        let mut take = |name: &str| match compiled.remove(name) {
            Some(program) if !program.is_empty() => Ok(program),
            _ => Err(invalid(format!("filter {name:?} is missing"))),
        };
        let deny = take(DENY_FILTER)?;
        let families = take(FAMILY_FILTER)?;
        let mut enosys = take(ENOSYS_FILTER)?;
        if target == TargetArch::x86_64 {
            enosys = with_x32_guard(enosys);
        }
        Ok(Self {
            filters: vec![deny, families, enosys].into(),
        })
    }

    /// Installs the filter on the calling thread. Requires no_new_privs (or CAP_SYS_ADMIN).
    ///
    /// The caller sets `no_new_privs` first; seccompiler's `apply_filter`, used here, sets
    /// it again (idempotent), then calls `seccomp(SECCOMP_SET_MODE_FILTER, 0, ..)` once per
    /// filter. Neither it nor this method allocates (its errors carry a bare OS errno),
    /// takes a lock or touches thread-local state, so it may run in a forked child between
    /// `fork` and `execve`. The filter is inherited across both.
    ///
    /// On error some of the filters may already be installed: the caller must not go on to
    /// run the command (in a forked child: exit).
    pub fn apply(&self) -> Result<(), SeccompError> {
        for filter in self.filters.iter() {
            seccompiler::apply_filter(filter).map_err(SeccompError::Apply)?;
        }
        Ok(())
    }

    /// Names of the syscalls this policy denies outright (for `warren doctor` and docs).
    ///
    /// These fail whatever their arguments: with EPERM, or ENOSYS for `clone3`. Syscalls
    /// denied only for some arguments (`clone`, `ioctl`, `personality`) are not listed.
    /// Sorted, for this machine's architecture.
    pub fn denied_syscalls() -> Vec<&'static str> {
        denied_for_arch(std::env::consts::ARCH)
    }
}

/// Maps an architecture name to seccompiler's, refusing those the policy is not written for.
fn target_arch(arch: &str) -> Result<TargetArch, SeccompError> {
    let unsupported = || SeccompError::UnsupportedArch {
        arch: arch.to_owned(),
    };
    if !SUPPORTED_ARCHES.contains(&arch) {
        return Err(unsupported());
    }
    TargetArch::try_from(arch).map_err(|_| unsupported())
}

fn invalid(reason: String) -> SeccompError {
    SeccompError::InvalidPolicy { reason }
}

/// Whether the policy section `key` applies when compiling for `arch`.
fn applies_to(key: &str, arch: &str) -> bool {
    match key.split_once('@') {
        Some((_, section_arch)) => section_arch == arch,
        None => true,
    }
}

/// The policy as seccompiler should see it for `arch`: each `name@arch` section merged into
/// `name`, sections for other architectures dropped.
fn select_filters(arch: &str) -> Result<Map<String, Value>, SeccompError> {
    let policy: Map<String, Value> =
        serde_json::from_str(POLICY_JSON).map_err(SeccompError::Parse)?;
    let mut selected = Map::new();
    let mut sections = Vec::new();
    for (key, filter) in policy {
        let base = match key.split_once('@') {
            Some((base, section_arch)) => {
                if !SUPPORTED_ARCHES.contains(&section_arch) {
                    return Err(invalid(format!(
                        "section {key:?} names an unsupported architecture"
                    )));
                }
                if section_arch == arch {
                    sections.push((base.to_owned(), filter));
                }
                continue;
            }
            None => key,
        };
        if !FILTERS.contains(&base.as_str()) {
            // A filter nothing installs would be a silent gap in the policy.
            return Err(invalid(format!("unknown filter {base:?}")));
        }
        selected.insert(base, filter);
    }
    for (base, section) in sections {
        let filter = selected
            .get_mut(&base)
            .ok_or_else(|| invalid(format!("{base}@{arch} extends no filter")))?;
        for action in ["mismatch_action", "match_action"] {
            if filter.get(action) != section.get(action) {
                return Err(invalid(format!(
                    "{base}@{arch} and {base} disagree on {action}"
                )));
            }
        }
        let rules = match section.get("filter") {
            Some(Value::Array(rules)) => rules.clone(),
            _ => return Err(invalid(format!("{base}@{arch} has no filter list"))),
        };
        match filter.get_mut("filter") {
            Some(Value::Array(existing)) => existing.extend(rules),
            _ => return Err(invalid(format!("{base} has no filter list"))),
        }
    }
    Ok(selected)
}

/// The parts of a policy filter [`denied_for_arch`] reads.
#[derive(Deserialize)]
struct ListedFilter<'a> {
    #[serde(borrow)]
    filter: Vec<ListedRule<'a>>,
}

/// The parts of a policy rule [`denied_for_arch`] reads.
#[derive(Deserialize)]
struct ListedRule<'a> {
    syscall: &'a str,
    #[serde(default)]
    args: Option<IgnoredAny>,
}

/// Names every filter selected for `arch` matches unconditionally, sorted and unique.
fn denied_for_arch(arch: &str) -> Vec<&'static str> {
    // The embedded policy always parses (the unit tests compile it); were it ever broken,
    // `runtime_policy` would report why, so an empty list here hides nothing.
    let Ok(policy) =
        serde_json::from_str::<BTreeMap<&'static str, ListedFilter<'static>>>(POLICY_JSON)
    else {
        return Vec::new();
    };
    let mut names: Vec<&'static str> = policy
        .into_iter()
        .filter(|(key, _)| applies_to(key, arch))
        .flat_map(|(_, filter)| filter.filter)
        .filter(|rule| rule.args.is_none())
        .map(|rule| rule.syscall)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Prefixes `program` with: if the syscall number has `__X32_SYSCALL_BIT`, fail with ENOSYS.
///
/// `program` is a complete filter (its own architecture check and loads, relative jumps),
/// so running it after three instructions that fall through to its start leaves it intact.
fn with_x32_guard(program: BpfProgram) -> BpfProgram {
    let mut guarded = Vec::with_capacity(program.len() + 3);
    guarded.push(sock_filter {
        code: BPF_LD_W_ABS,
        jt: 0,
        jf: 0,
        k: SECCOMP_DATA_NR_OFFSET,
    });
    guarded.push(sock_filter {
        code: BPF_JGE_K,
        jt: 0,
        jf: 1,
        k: X32_SYSCALL_BIT,
    });
    guarded.push(sock_filter {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    });
    guarded.extend(program);
    guarded
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Syscalls every architecture's policy must deny outright.
    const REQUIRED: &[&str] = &[
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "unshare",
        "setns",
        "bpf",
        "keyctl",
        "add_key",
        "request_key",
        "kexec_load",
        "kexec_file_load",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "perf_event_open",
        "userfaultfd",
        "init_module",
        "finit_module",
        "delete_module",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "quotactl",
        "quotactl_fd",
        "open_by_handle_at",
        "name_to_handle_at",
        "lookup_dcookie",
        "syslog",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
        "vhangup",
        "kcmp",
        "clone3",
    ];

    /// Syscalls only x86_64 has, which its policy must deny outright.
    const REQUIRED_X86_64: &[&str] = &["iopl", "ioperm", "uselib"];

    const CLONE_NEW_FLAGS: &[(&str, u64)] = &[
        ("CLONE_NEWNS", 0x0002_0000),
        ("CLONE_NEWCGROUP", 0x0200_0000),
        ("CLONE_NEWUTS", 0x0400_0000),
        ("CLONE_NEWIPC", 0x0800_0000),
        ("CLONE_NEWUSER", 0x1000_0000),
        ("CLONE_NEWPID", 0x2000_0000),
        ("CLONE_NEWNET", 0x4000_0000),
        ("CLONE_NEWTIME", 0x0000_0080),
    ];

    /// What glibc's `fork` passes: CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD.
    const FORK_FLAGS: u64 = 0x0120_0011;
    /// What glibc's `pthread_create` passes to `clone`: VM, FS, FILES, SIGHAND, THREAD,
    /// SYSVSEM, SETTLS, PARENT_SETTID, CHILD_CLEARTID.
    const THREAD_FLAGS: u64 = 0x003d_0f00;

    const EPERM: Verdict = Verdict::Errno(1);
    const EAFNOSUPPORT: Verdict = Verdict::Errno(97);
    const ENOSYS: Verdict = Verdict::Errno(38);

    /// The syscall numbers and audit values these tests need, per architecture.
    struct Abi {
        arch: &'static str,
        audit_arch: u32,
        /// The other ABI the same kernel runs (i386, AArch32).
        foreign_audit_arch: u32,
        read: i32,
        mount: i32,
        unshare: i32,
        clone: i32,
        clone3: i32,
        ioctl: i32,
        personality: i32,
        socket: i32,
        socketpair: i32,
        mknodat: i32,
    }

    const X86_64: Abi = Abi {
        arch: "x86_64",
        audit_arch: 0xc000_003e,
        foreign_audit_arch: 0x4000_0003,
        read: 0,
        mount: 165,
        unshare: 272,
        clone: 56,
        clone3: 435,
        ioctl: 16,
        personality: 135,
        socket: 41,
        socketpair: 53,
        mknodat: 259,
    };

    const AARCH64: Abi = Abi {
        arch: "aarch64",
        audit_arch: 0xc000_00b7,
        foreign_audit_arch: 0x4000_0028,
        read: 63,
        mount: 40,
        unshare: 97,
        clone: 220,
        clone3: 435,
        ioctl: 29,
        personality: 92,
        socket: 198,
        socketpair: 199,
        mknodat: 33,
    };

    const ABIS: [&Abi; 2] = [&X86_64, &AARCH64];

    #[derive(Debug, PartialEq, Eq)]
    enum Verdict {
        Allow,
        Errno(u32),
        KillProcess,
        Other(u32),
    }

    /// A classic BPF interpreter for the instructions seccomp filters use, run against a
    /// `struct seccomp_data` laid out as the kernel lays it out.
    fn run_filter(program: &[sock_filter], data: &[u8; 64]) -> u32 {
        let load = |offset: u32| {
            let at = offset as usize;
            u32::from_le_bytes(data[at..at + 4].try_into().expect("in bounds"))
        };
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let insn = &program[pc];
            pc += 1;
            match insn.code {
                0x20 => acc = load(insn.k),
                0x54 => acc &= insn.k,
                0x05 => pc += insn.k as usize,
                0x15 | 0x25 | 0x35 => {
                    let taken = match insn.code {
                        0x15 => acc == insn.k,
                        0x25 => acc > insn.k,
                        _ => acc >= insn.k,
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                0x06 => return insn.k,
                code => panic!("unexpected bpf opcode {code:#x}"),
            }
        }
    }

    /// What the kernel answers for one syscall under every filter of `program`: each runs,
    /// the most restrictive action wins, ties go to the most recently installed.
    fn verdict(program: &SeccompProgram, audit_arch: u32, nr: i32, args: [u64; 6]) -> Verdict {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&audit_arch.to_le_bytes());
        for (i, arg) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_le_bytes());
        }
        let action = |ret: u32| (ret & libc::SECCOMP_RET_ACTION_FULL) as i32;
        let mut ret = libc::SECCOMP_RET_ALLOW;
        for filter in program.filters.iter().rev() {
            let current = run_filter(filter, &data);
            if action(current) < action(ret) {
                ret = current;
            }
        }
        match ret & libc::SECCOMP_RET_ACTION_FULL {
            libc::SECCOMP_RET_ALLOW => Verdict::Allow,
            libc::SECCOMP_RET_ERRNO => Verdict::Errno(ret & libc::SECCOMP_RET_DATA),
            libc::SECCOMP_RET_KILL_PROCESS => Verdict::KillProcess,
            _ => Verdict::Other(ret),
        }
    }

    fn call(abi: &Abi, nr: i32, args: [u64; 6]) -> Verdict {
        let program = SeccompProgram::for_arch(abi.arch).expect("policy compiles");
        verdict(&program, abi.audit_arch, nr, args)
    }

    fn arg0(value: u64) -> [u64; 6] {
        [value, 0, 0, 0, 0, 0]
    }

    fn arg1(value: u64) -> [u64; 6] {
        [0, value, 0, 0, 0, 0]
    }

    /// Every syscall name the policy mentions for `arch`, conditional or not.
    fn all_names_for(arch: &str) -> Vec<String> {
        let policy: BTreeMap<&str, ListedFilter<'_>> =
            serde_json::from_str(POLICY_JSON).expect("policy parses");
        policy
            .into_iter()
            .filter(|(key, _)| applies_to(key, arch))
            .flat_map(|(_, filter)| filter.filter)
            .map(|rule| rule.syscall.to_owned())
            .collect()
    }

    #[test]
    fn the_embedded_policy_compiles_for_x86_64_and_aarch64() {
        for arch in SUPPORTED_ARCHES {
            let program = SeccompProgram::for_arch(arch)
                .unwrap_or_else(|e| panic!("{arch}: {e}: {:?}", std::error::Error::source(&e)));
            assert_eq!(program.filters.len(), 3, "{arch}");
        }
    }

    #[test]
    fn the_policy_compiles_for_this_machine() {
        let program = SeccompProgram::runtime_policy().expect("policy compiles");
        assert!(format!("{program:?}").contains("instructions"));
    }

    #[test]
    fn an_architecture_the_policy_is_not_written_for_is_refused() {
        for arch in ["riscv64", "x86", "sparc"] {
            let err = SeccompProgram::for_arch(arch).expect_err(arch);
            assert!(
                matches!(&err, SeccompError::UnsupportedArch { arch: a } if a == arch),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                format!("seccomp filtering is not supported on {arch}")
            );
        }
    }

    #[test]
    fn every_name_in_the_policy_resolves_on_its_architectures() {
        for arch in SUPPORTED_ARCHES {
            let target = target_arch(arch).expect("supported");
            for name in all_names_for(arch) {
                let probe = format!(
                    r#"{{"probe":{{"mismatch_action":"allow","match_action":"trap","filter":[{{"syscall":"{name}"}}]}}}}"#
                );
                assert!(
                    seccompiler::compile_from_json(probe.as_bytes(), target).is_ok(),
                    "{name} is unknown on {arch}"
                );
            }
        }
    }

    #[test]
    fn the_policy_denies_every_required_syscall_outright() {
        for arch in SUPPORTED_ARCHES {
            let denied = denied_for_arch(arch);
            for name in REQUIRED {
                assert!(denied.contains(name), "{name} is not denied on {arch}");
            }
        }
        let denied = denied_for_arch("x86_64");
        for name in REQUIRED_X86_64 {
            assert!(denied.contains(name), "{name} is not denied on x86_64");
        }
    }

    #[test]
    fn x86_64_only_names_stay_out_of_the_aarch64_policy() {
        let names = all_names_for("aarch64");
        for name in REQUIRED_X86_64 {
            assert!(!names.iter().any(|n| n == name), "{name}");
        }
    }

    #[test]
    fn the_denied_list_for_this_machine_is_sorted_and_unique() {
        let denied = SeccompProgram::denied_syscalls();
        assert!(denied.len() >= REQUIRED.len());
        assert!(denied.windows(2).all(|pair| pair[0] < pair[1]));
        for conditional in ["clone", "ioctl", "personality"] {
            assert!(!denied.contains(&conditional), "{conditional}");
        }
    }

    #[test]
    fn a_denied_syscall_fails_with_eperm_on_both_architectures() {
        for abi in ABIS {
            assert_eq!(call(abi, abi.mount, [0; 6]), EPERM, "{}", abi.arch);
            assert_eq!(call(abi, abi.unshare, arg0(0x1000_0000)), EPERM);
        }
    }

    #[test]
    fn ordinary_syscalls_are_allowed() {
        for abi in ABIS {
            assert_eq!(call(abi, abi.read, [0; 6]), Verdict::Allow, "{}", abi.arch);
        }
    }

    #[test]
    fn clone3_fails_with_enosys_so_libc_falls_back_to_clone() {
        for abi in ABIS {
            assert_eq!(call(abi, abi.clone3, [0; 6]), ENOSYS, "{}", abi.arch);
        }
    }

    #[test]
    fn clone_is_denied_for_each_namespace_flag_alone_or_mixed_in() {
        let all_flags = CLONE_NEW_FLAGS.iter().fold(0, |acc, (_, flag)| acc | flag);
        for abi in ABIS {
            for (name, flag) in CLONE_NEW_FLAGS {
                assert_eq!(call(abi, abi.clone, arg0(*flag)), EPERM, "{name}");
                assert_eq!(call(abi, abi.clone, arg0(flag | FORK_FLAGS)), EPERM);
                assert_eq!(call(abi, abi.clone, arg0(flag | THREAD_FLAGS)), EPERM);
            }
            assert_eq!(call(abi, abi.clone, arg0(all_flags)), EPERM);
        }
    }

    #[test]
    fn clone_without_namespace_flags_is_allowed_for_fork_and_threads() {
        for abi in ABIS {
            for flags in [0, FORK_FLAGS, THREAD_FLAGS, 0x4111 /* vfork-like */] {
                assert_eq!(
                    call(abi, abi.clone, arg0(flags)),
                    Verdict::Allow,
                    "{} {flags:#x}",
                    abi.arch
                );
            }
        }
    }

    #[test]
    fn terminal_injection_ioctls_are_denied_even_with_high_bits_set() {
        for abi in ABIS {
            for request in [0x5412, 0x541c, 0x1_0000_5412, 0xffff_ffff_0000_541c] {
                assert_eq!(call(abi, abi.ioctl, arg1(request)), EPERM, "{request:#x}");
            }
            for request in [0x5401 /* TCGETS */, 0x5413 /* TIOCGWINSZ */] {
                assert_eq!(call(abi, abi.ioctl, arg1(request)), Verdict::Allow);
            }
        }
    }

    #[test]
    fn personality_allows_only_per_linux_and_the_query() {
        for abi in ABIS {
            for allowed in [0, 0xffff_ffff] {
                assert_eq!(call(abi, abi.personality, arg0(allowed)), Verdict::Allow);
            }
            for denied in [
                8,           /* UNAME26 */
                0x0004_0000, /* ADDR_NO_RANDOMIZE */
                1,
            ] {
                assert_eq!(call(abi, abi.personality, arg0(denied)), EPERM, "{denied}");
            }
        }
    }

    #[test]
    fn only_the_unix_inet_inet6_and_netlink_socket_families_are_allowed() {
        let allowed = [
            1,  /* AF_UNIX */
            2,  /* AF_INET */
            10, /* AF_INET6 */
            16, /* AF_NETLINK */
        ];
        for abi in ABIS {
            for syscall in [abi.socket, abi.socketpair] {
                for family in 0..64u64 {
                    let expected = if allowed.contains(&family) {
                        Verdict::Allow
                    } else {
                        EAFNOSUPPORT
                    };
                    assert_eq!(
                        call(abi, syscall, arg0(family)),
                        expected,
                        "{} syscall {syscall} family {family}",
                        abi.arch
                    );
                }
                // The kernel reads the family as an int: high bits change nothing.
                assert_eq!(call(abi, syscall, arg0(0x1_0000_0028)), EAFNOSUPPORT);
                assert_eq!(
                    call(abi, syscall, arg0(0xffff_ffff_0000_0002)),
                    Verdict::Allow
                );
            }
        }
    }

    #[test]
    fn netlink_sockets_are_allowed_only_for_route_diagnostics_and_generic_netlink() {
        const AF_NETLINK: u64 = 16;
        for abi in ABIS {
            for protocol in 0..32u64 {
                let expected = if [0, 4, 16].contains(&protocol) {
                    Verdict::Allow
                } else {
                    EAFNOSUPPORT
                };
                assert_eq!(
                    call(abi, abi.socket, [AF_NETLINK, 3, protocol, 0, 0, 0]),
                    expected,
                    "{} netlink protocol {protocol}",
                    abi.arch
                );
            }
            // NETLINK_KOBJECT_UEVENT with high bits set, and as any socket type.
            for kind in [2, 3, 0x80003 /* SOCK_RAW | SOCK_CLOEXEC */] {
                assert_eq!(
                    call(abi, abi.socket, [AF_NETLINK, kind, 0x1_0000_000f, 0, 0, 0]),
                    EAFNOSUPPORT
                );
            }
            // Protocol numbers of other families are not netlink's.
            assert_eq!(call(abi, abi.socket, [2, 1, 6, 0, 0, 0]), Verdict::Allow);
        }
    }

    #[test]
    fn x32_syscalls_fail_with_enosys_on_x86_64() {
        let x32 = |nr: i32| nr | X32_SYSCALL_BIT as i32;
        assert_eq!(call(&X86_64, x32(X86_64.read), [0; 6]), ENOSYS);
        assert_eq!(call(&X86_64, x32(X86_64.mount), [0; 6]), ENOSYS);
        assert_eq!(call(&X86_64, x32(521 /* x32 ptrace */), [0; 6]), ENOSYS);
        assert_eq!(call(&X86_64, -1, [0; 6]), ENOSYS);
    }

    #[test]
    fn a_syscall_from_a_foreign_abi_kills_the_process() {
        for abi in ABIS {
            let program = SeccompProgram::for_arch(abi.arch).expect("policy compiles");
            assert_eq!(
                verdict(&program, abi.foreign_audit_arch, abi.read, [0; 6]),
                Verdict::KillProcess,
                "{}",
                abi.arch
            );
        }
    }

    #[test]
    fn the_errno_values_are_the_kernels() {
        assert_eq!(EPERM, Verdict::Errno(libc::EPERM as u32));
        assert_eq!(EAFNOSUPPORT, Verdict::Errno(libc::EAFNOSUPPORT as u32));
        assert_eq!(ENOSYS, Verdict::Errno(libc::ENOSYS as u32));
    }

    #[test]
    fn an_arch_section_for_another_machine_is_left_out() {
        let selected = select_filters("aarch64").expect("selects");
        assert_eq!(
            selected.keys().map(String::as_str).collect::<Vec<_>>(),
            vec![DENY_FILTER, FAMILY_FILTER, ENOSYS_FILTER]
        );
        let x86 = select_filters("x86_64").expect("selects");
        let rules = |map: &Map<String, Value>| map[DENY_FILTER]["filter"].as_array().map(Vec::len);
        let policy: Value = serde_json::from_str(POLICY_JSON).unwrap();
        let x86_only = policy[format!("{DENY_FILTER}@x86_64")]["filter"]
            .as_array()
            .map_or(0, Vec::len);
        assert!(x86_only >= REQUIRED_X86_64.len());
        assert_eq!(
            rules(&x86).unwrap_or(0),
            rules(&selected).unwrap_or(0) + x86_only
        );
    }

    #[test]
    fn device_nodes_are_refused_and_fifos_and_files_are_not() {
        const S_IFCHR: u64 = 0o020000;
        const S_IFBLK: u64 = 0o060000;
        const S_IFIFO: u64 = 0o010000;
        const S_IFREG: u64 = 0o100000;
        for abi in ABIS {
            for kind in [S_IFCHR, S_IFBLK] {
                let mode = kind | 0o666;
                assert_eq!(
                    call(abi, abi.mknodat, [0, 0, mode, 0, 0, 0]),
                    EPERM,
                    "{}",
                    abi.arch
                );
            }
            for kind in [S_IFIFO, S_IFREG] {
                let mode = kind | 0o644;
                assert_eq!(
                    call(abi, abi.mknodat, [0, 0, mode, 0, 0, 0]),
                    Verdict::Allow,
                    "{}",
                    abi.arch
                );
            }
        }
    }
}
