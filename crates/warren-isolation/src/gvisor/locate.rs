//! Finding runsc (configured, on PATH, or in the usual directories) and asking its version.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::bounded::{failure_detail, run_bounded, Ran};
use super::{COMMAND_LIMIT, INSTALL_HINT, WELL_KNOWN_DIRS};

/// The configured runsc when it is an executable file, else the first `runsc` on `path`
/// (absolute entries only: a relative one would depend on the working directory) or in
/// the usual directories.
pub(super) fn locate(configured: Option<&Path>, path: Option<&OsStr>) -> Result<PathBuf, String> {
    if let Some(configured) = configured {
        return if is_executable(configured) {
            Ok(configured.to_owned())
        } else {
            Err(format!(
                "runsc not found at {} (the configured path): {INSTALL_HINT}, or configure \
                 where runsc is",
                configured.display()
            ))
        };
    }
    let listed = path
        .map(|path| std::env::split_paths(path).collect::<Vec<_>>())
        .unwrap_or_default();
    listed
        .into_iter()
        .filter(|dir| dir.is_absolute())
        .chain(WELL_KNOWN_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join("runsc"))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| format!("runsc not found: {INSTALL_HINT}"))
}

pub(super) fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

pub(super) fn version_of(runsc: &Path, dir: &Path) -> Result<String, String> {
    let reinstall = "reinstall Debian's runsc package (apt-get install --reinstall runsc)";
    let mut command = Command::new(runsc);
    command.arg("--version");
    match run_bounded(&mut command, COMMAND_LIMIT, dir, "version") {
        Ran::Finished(done) if done.status.success() => {
            parse_version(&done.stdout).ok_or_else(|| {
                format!(
                    "`{} --version` printed no version: {reinstall}",
                    runsc.display()
                )
            })
        }
        Ran::Finished(done) => Err(format!(
            "`{} --version` failed ({}): {reinstall}",
            runsc.display(),
            failure_detail(done.status, &done.stderr)
        )),
        Ran::TimedOut => Err(format!(
            "`{} --version` did not finish within {} s: {reinstall}",
            runsc.display(),
            COMMAND_LIMIT.as_secs()
        )),
        Ran::NotStarted(error) => Err(format!(
            "cannot run {} ({error}): {reinstall}",
            runsc.display()
        )),
    }
}

/// The version in `runsc --version`'s output: its first line, without the `runsc version`
/// prefix this runsc prints (`runsc version 0.0~20221219.0` → `0.0~20221219.0`).
fn parse_version(stdout: &str) -> Option<String> {
    let first = stdout
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())?;
    let version = first.strip_prefix("runsc version").unwrap_or(first).trim();
    (!version.is_empty()).then(|| version.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_first_line_without_runscs_prefix() {
        assert_eq!(
            parse_version("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n").as_deref(),
            Some("0.0~20221219.0")
        );
        assert_eq!(
            parse_version("\nrunsc version release-20240513.0\n").as_deref(),
            Some("release-20240513.0")
        );
        assert_eq!(parse_version("1.2.3\n").as_deref(), Some("1.2.3"));
        assert_eq!(parse_version("runsc version \n"), None);
        assert_eq!(parse_version(""), None);
    }
}
