//! A container's root, as a script its PID 1 runs before the command.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::pod::VolumeMountPlan;
use super::{Settings, Tools, BINARY_IN_CONTAINER, SETUP_EXIT, SETUP_FAILED};

/// What backs a directory of the container's view.
#[derive(Debug, Clone)]
enum Backing {
    /// A tmpfs of the kubelet's (the root, a shadow): entries are made by the script.
    Synthetic,
    /// A host directory or file, bound read-only.
    Host(PathBuf),
    /// A volume (an emptyDir's directory, a claim's subPath), bound as declared.
    Volume(PathBuf),
    /// `/proc`, `/sys`, `/dev`, masks, the kubelet's own: nothing is mounted inside.
    Special,
}

enum Entry {
    Dir,
    File,
    Link(String),
    Missing,
    Special,
}

/// The container's view as the script builds it.
pub(super) struct View<'a> {
    tools: &'a Tools,
    /// The root's directory on the host (mounted over inside the container's namespace).
    root: String,
    /// Mount points, in the order made: (container path, backing, is a directory).
    mounts: Vec<(String, Backing, bool)>,
    /// Paths the script makes (container path → is a directory).
    made: BTreeMap<String, bool>,
    /// Symbolic links the script makes (container path → target).
    links: BTreeMap<String, String>,
    /// Mounts made read-only once every mount point is made.
    read_only_at_end: Vec<String>,
    lines: Vec<String>,
}

impl<'a> View<'a> {
    pub(super) fn new(tools: &'a Tools, root: String) -> Self {
        let mount = q(&tools.mount.display().to_string());
        let lines = vec![
            format!("trap 'echo \"{SETUP_FAILED}\" >&2; exit {SETUP_EXIT}' EXIT"),
            "set -e".to_owned(),
            format!("{mount} --make-rprivate /"),
            format!(
                "{mount} -t tmpfs -o mode=0755,size=16m warren-kubelet-root {}",
                q(&root)
            ),
        ];
        Self {
            tools,
            root,
            mounts: vec![("/".to_owned(), Backing::Synthetic, true)],
            made: BTreeMap::new(),
            links: BTreeMap::new(),
            read_only_at_end: Vec::new(),
            lines,
        }
    }

    /// `path` (a container path) on the host, inside the root.
    fn at(&self, path: &str) -> String {
        if path == "/" {
            q(&self.root)
        } else {
            q(&format!("{}{path}", self.root))
        }
    }

    fn run(&mut self, tool: &Path, args: &[String]) {
        let mut line = q(&tool.display().to_string());
        for arg in args {
            line.push(' ');
            line.push_str(arg);
        }
        self.lines.push(line);
    }

    fn mkdir(&mut self, path: &str, mode: Option<&str>) {
        let mut args = Vec::new();
        if let Some(mode) = mode {
            args.push(format!("-m {mode}"));
        }
        args.push(self.at(path));
        self.run(self.tools.mkdir.as_path(), &args);
        self.made.insert(path.to_owned(), true);
    }

    fn touch(&mut self, path: &str) {
        let args = [self.at(path)];
        self.run(self.tools.touch.as_path(), &args);
        self.made.insert(path.to_owned(), false);
    }

    fn symlink(&mut self, target: &str, path: &str) {
        let args = ["-s".to_owned(), q(target), self.at(path)];
        self.run(self.tools.ln.as_path(), &args);
        self.links.insert(path.to_owned(), target.to_owned());
    }

    /// Binds the host's `source` at `path` (made as a directory or a file first).
    fn bind_host(&mut self, source: &Path, path: &str, is_dir: bool) {
        if is_dir {
            self.mkdir(path, None);
        } else {
            self.touch(path);
        }
        let args = [
            "--bind".to_owned(),
            q(&source.display().to_string()),
            self.at(path),
        ];
        self.run(self.tools.mount.as_path(), &args);
        let args = ["-o remount,bind,ro".to_owned(), self.at(path)];
        self.run(self.tools.mount.as_path(), &args);
        self.made.remove(path);
        self.mounts
            .push((path.to_owned(), Backing::Host(source.to_owned()), is_dir));
    }

    /// Mounts `args` at `path`, or binds `fallback` (mount's arguments) read-only there if
    /// that fails.
    fn mount_special(&mut self, path: &str, args: &[&str], fallback: Option<&str>) {
        self.mkdir(path, None);
        let mount = q(&self.tools.mount.display().to_string());
        let mut line = format!("{mount} {} {}", args.join(" "), self.at(path));
        if let Some(fallback) = fallback {
            let at = self.at(path);
            line.push_str(&format!(
                " || {{ {mount} {fallback} {at} && {mount} -o remount,bind,ro {at}; }}"
            ));
        }
        self.lines.push(line);
        self.made.remove(path);
        self.mounts.push((path.to_owned(), Backing::Special, true));
    }

    /// The host's root, `/proc`, `/sys`, `/dev`, `/tmp`, `/run`, the masks and the binary.
    pub(super) fn base(&mut self, settings: &Settings) -> Result<(), String> {
        let mut entries: Vec<_> = fs::read_dir("/")
            .map_err(|e| format!("read /: {e}"))?
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if matches!(
                name.as_str(),
                "proc" | "sys" | "dev" | "tmp" | "run" | "lost+found" | ".warren-kubelet"
            ) {
                continue;
            }
            let path = format!("/{name}");
            let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = fs::read_link(entry.path()) {
                    self.symlink(&target.display().to_string(), &path);
                }
            } else if meta.is_dir() {
                self.bind_host(&entry.path(), &path, true);
            } else if meta.is_file() {
                self.bind_host(&entry.path(), &path, false);
            }
        }
        self.mkdir("/tmp", Some("1777"));
        self.mkdir("/run", Some("0755"));
        self.mount_special("/proc", &["-t proc", "proc"], None);
        // A sysfs of the pod's network namespace; the host's, read-only, where the kernel
        // refuses a new one.
        self.mount_special(
            "/sys",
            &["-t sysfs", "-o ro,nosuid,nodev,noexec", "sysfs"],
            Some("--bind /sys"),
        );
        // /dev is the kubelet's tmpfs: volumes may be mounted in it (a /dev/shm emptyDir).
        self.mkdir("/dev", None);
        let args = [
            "-t tmpfs -o mode=0755,size=64k,nosuid,noexec warren-kubelet-dev".to_owned(),
            self.at("/dev"),
        ];
        self.run(self.tools.mount.as_path(), &args);
        self.made.remove("/dev");
        self.mounts
            .push(("/dev".to_owned(), Backing::Synthetic, true));
        for device in ["null", "zero", "full", "random", "urandom", "tty"] {
            let host = Path::new("/dev").join(device);
            if !host.exists() {
                continue;
            }
            let path = format!("/dev/{device}");
            self.touch(&path);
            let args = [
                "--bind".to_owned(),
                q(&host.display().to_string()),
                self.at(&path),
            ];
            self.run(self.tools.mount.as_path(), &args);
        }
        self.mkdir("/dev/pts", None);
        let mount = q(&self.tools.mount.display().to_string());
        self.lines.push(format!(
            "{mount} -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts {pts} || \
             {mount} --bind /dev/pts {pts}",
            pts = self.at("/dev/pts")
        ));
        self.symlink("pts/ptmx", "/dev/ptmx");
        self.mkdir("/dev/shm", Some("1777"));
        let args = [
            "-t tmpfs -o mode=1777,size=64m,nosuid,nodev shm".to_owned(),
            self.at("/dev/shm"),
        ];
        self.run(self.tools.mount.as_path(), &args);
        for (link, target) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            self.symlink(target, &format!("/dev/{link}"));
        }
        // What the host's root would show of the kubelet's state and of whole claims.
        for hidden in &settings.hidden {
            let Some(hidden) = hidden.to_str() else {
                continue;
            };
            if let Some(path) = self.existing_dir(hidden) {
                let args = [
                    "-t tmpfs -o ro,mode=0755,size=4k warren-kubelet-mask".to_owned(),
                    self.at(&path),
                ];
                self.run(self.tools.mount.as_path(), &args);
                self.mounts.push((path, Backing::Special, true));
            }
        }
        self.mkdir("/.warren-kubelet", Some("0755"));
        self.bind_host(&settings.binary, BINARY_IN_CONTAINER, false);
        self.mounts
            .push(("/.warren-kubelet".to_owned(), Backing::Special, true));
        Ok(())
    }

    /// Mounts a volume at its mountPath, making the mount point.
    pub(super) fn bind_volume(&mut self, mount: &VolumeMountPlan) -> Result<(), String> {
        let path = self.ensure(&mount.target, mount.is_dir)?;
        let args = [
            "--bind".to_owned(),
            q(&mount.source.display().to_string()),
            self.at(&path),
        ];
        self.run(self.tools.mount.as_path(), &args);
        if mount.read_only {
            self.read_only_at_end.push(path.clone());
        }
        self.mounts
            .push((path, Backing::Volume(mount.source.clone()), mount.is_dir));
        Ok(())
    }

    /// The deepest mount covering `path` (the latest made, among equals), with `path`
    /// relative to it.
    fn covering(&self, path: &str) -> (&str, &Backing, String) {
        let mut best: Option<&(String, Backing, bool)> = None;
        for mount in &self.mounts {
            if within_or_at(path, &mount.0) && best.is_none_or(|b| mount.0.len() >= b.0.len()) {
                best = Some(mount);
            }
        }
        let (at, backing, _) = best.expect("the root covers every path");
        let relative = path[at.len()..].trim_start_matches('/').to_owned();
        (at, backing, relative)
    }

    fn lookup(&self, path: &str) -> Entry {
        if let Some(target) = self.links.get(path) {
            return Entry::Link(target.clone());
        }
        if let Some(is_dir) = self.made.get(path) {
            return if *is_dir { Entry::Dir } else { Entry::File };
        }
        if let Some((_, backing, is_dir)) = self.mounts.iter().rev().find(|m| m.0 == path) {
            return match backing {
                Backing::Special => Entry::Special,
                _ if *is_dir => Entry::Dir,
                _ => Entry::File,
            };
        }
        let (_, backing, relative) = self.covering(path);
        match backing {
            Backing::Synthetic => Entry::Missing,
            Backing::Special => Entry::Special,
            Backing::Host(dir) | Backing::Volume(dir) => {
                match fs::symlink_metadata(dir.join(relative)) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        match fs::read_link(dir.join(self.covering(path).2)) {
                            Ok(target) => Entry::Link(target.display().to_string()),
                            Err(_) => Entry::Missing,
                        }
                    }
                    Ok(meta) if meta.is_dir() => Entry::Dir,
                    Ok(_) => Entry::File,
                    Err(_) => Entry::Missing,
                }
            }
        }
    }

    /// `path` resolved (symbolic links inside the container's root) if it is an existing
    /// directory seen through the host's root.
    fn existing_dir(&self, path: &str) -> Option<String> {
        let mut todo: VecDeque<String> = components(path);
        let mut current = "/".to_owned();
        let mut hops = 0;
        while let Some(part) = todo.pop_front() {
            if part == ".." {
                current = parent(&current);
                continue;
            }
            let next = join(&current, &part);
            match self.lookup(&next) {
                Entry::Dir => current = next,
                Entry::Link(target) => {
                    hops += 1;
                    if hops > 40 {
                        return None;
                    }
                    if target.starts_with('/') {
                        current = "/".to_owned();
                    }
                    let mut parts = components(&target);
                    parts.extend(todo.drain(..));
                    todo = parts;
                }
                Entry::File | Entry::Missing | Entry::Special => return None,
            }
        }
        matches!(self.covering(&current).1, Backing::Host(_)).then_some(current)
    }

    /// Makes `path` exist (a directory, or a file when `!is_dir`) and answers where it
    /// resolved to; a host directory on the way that lacks an entry is shadowed.
    fn ensure(&mut self, path: &str, is_dir: bool) -> Result<String, String> {
        let mut todo: VecDeque<String> = components(path);
        let mut current = "/".to_owned();
        let mut hops = 0;
        while let Some(part) = todo.pop_front() {
            if part == ".." {
                current = parent(&current);
                continue;
            }
            let next = join(&current, &part);
            let last = todo.is_empty();
            match self.lookup(&next) {
                Entry::Dir => current = next,
                Entry::File if last && !is_dir => current = next,
                Entry::File => return Err(format!("{next} is not a directory")),
                Entry::Special => {
                    return Err(format!("{next} is the kubelet's; nothing is mounted there"))
                }
                Entry::Link(target) => {
                    hops += 1;
                    if hops > 40 {
                        return Err(format!("too many symbolic links resolving {path}"));
                    }
                    if target.starts_with('/') {
                        current = "/".to_owned();
                    }
                    let mut parts = components(&target);
                    parts.extend(todo.drain(..));
                    todo = parts;
                }
                Entry::Missing => {
                    let (_, backing, _) = self.covering(&next);
                    match backing.clone() {
                        Backing::Synthetic | Backing::Volume(_) => {}
                        Backing::Host(_) => self.shadow(&current)?,
                        Backing::Special => {
                            return Err(format!(
                                "{next} is the kubelet's; nothing is mounted there"
                            ))
                        }
                    }
                    if last && !is_dir {
                        self.touch(&next);
                    } else {
                        self.mkdir(&next, None);
                    }
                    current = next;
                }
            }
        }
        Ok(current)
    }

    /// Replaces the host directory at `dir` by a tmpfs holding read-only binds of each of
    /// its entries (and its symbolic links), so entries can be added without writing to
    /// the host.
    fn shadow(&mut self, dir: &str) -> Result<(), String> {
        let (_, backing, relative) = self.covering(dir);
        let Backing::Host(host) = backing else {
            return Err(format!("{dir} is not a host directory"));
        };
        let host = host.join(relative);
        let meta = fs::metadata(&host).map_err(|e| format!("{}: {e}", host.display()))?;
        let args = [
            format!(
                "-t tmpfs -o mode={:o},uid={},gid={},size=1m warren-kubelet-shadow",
                meta.mode() & 0o7777,
                meta.uid(),
                meta.gid()
            ),
            self.at(dir),
        ];
        self.run(self.tools.mount.as_path(), &args);
        self.mounts.push((dir.to_owned(), Backing::Synthetic, true));
        self.read_only_at_end.push(format!("shadow:{dir}"));
        let mut entries: Vec<_> = fs::read_dir(&host)
            .map_err(|e| format!("{}: {e}", host.display()))?
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let path = join(dir, &name);
            let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = fs::read_link(entry.path()) {
                    self.symlink(&target.display().to_string(), &path);
                }
            } else {
                self.bind_host(&entry.path(), &path, meta.is_dir());
            }
        }
        Ok(())
    }

    /// The whole script: the read-only remounts, the hostname, `pivot_root`, the working
    /// directory and the command as the container's user.
    pub(super) fn finish(
        mut self,
        hostname: &str,
        read_only_root: bool,
        working_dir: &str,
        setpriv: &str,
    ) -> String {
        let mount = q(&self.tools.mount.display().to_string());
        for path in std::mem::take(&mut self.read_only_at_end) {
            match path.strip_prefix("shadow:") {
                Some(dir) => self
                    .lines
                    .push(format!("{mount} -o remount,ro {}", self.at(dir))),
                None => self
                    .lines
                    .push(format!("{mount} -o remount,bind,ro {}", self.at(&path))),
            }
        }
        self.lines.push(format!(
            "printf '%s' {} > /proc/sys/kernel/hostname",
            q(hostname)
        ));
        let old = "/.warren-kubelet-old";
        self.lines.push(format!("cd {}", q(&self.root)));
        self.mkdir(old, None);
        self.lines.push(format!(
            "{} . .{old}",
            q(&self.tools.pivot_root.display().to_string())
        ));
        self.lines.push("cd /".to_owned());
        self.lines.push(format!(
            "{} -l {old}",
            q(&self.tools.umount.display().to_string())
        ));
        self.lines.push(format!(
            "{} {old}",
            q(&self.tools.rmdir.display().to_string())
        ));
        if read_only_root {
            self.lines.push(format!("{mount} -o remount,ro /"));
        }
        self.lines.push(format!("cd {}", q(working_dir)));
        self.lines.push("trap - EXIT".to_owned());
        self.lines.push(format!("exec {setpriv} -- \"$@\""));
        let mut script = self.lines.join("\n");
        script.push('\n');
        script
    }
}

fn components(path: &str) -> VecDeque<String> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
        .collect()
}

pub(super) fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn parent(path: &str) -> String {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/".to_owned(),
        Some((parent, _)) => parent.to_owned(),
    }
}

fn within_or_at(path: &str, dir: &str) -> bool {
    dir == "/" || path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// An absolute path without `.`, `..` or empty components.
pub(super) fn normalise(path: &str) -> Option<String> {
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return None;
    }
    let parts = components(path);
    Some(if parts.is_empty() {
        "/".to_owned()
    } else {
        parts.iter().fold(String::new(), |acc, c| acc + "/" + c)
    })
}

/// A word the shell reads back as `value`.
pub(super) fn q(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalise_and_shell_words_quote() {
        assert_eq!(normalise("/home//gem/./x/").as_deref(), Some("/home/gem/x"));
        assert_eq!(normalise("/a/../b"), None);
        assert_eq!(normalise("relative"), None);
        assert_eq!(q("it's"), r"'it'\''s'");
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
        assert!(within_or_at("/home/gem", "/home"));
        assert!(!within_or_at("/homes", "/home"));
    }
}
