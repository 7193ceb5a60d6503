//! The text a session's shell runs for one command: the command, wrapped so that its
//! output is framed by markers carrying a nonce the wrapper text never holds whole.

use super::*;

/// Quotes `text` as one shell word.
pub(super) fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The text the session's shell runs first: it moves to the session's directory. Nothing in
/// it is a command's: its output is never read.
pub(super) fn prelude(flavor: Flavor, start_dir: &str) -> String {
    format!(
        "{cd} -- {dir} </dev/null; unset OLDPWD\n",
        cd = if flavor == Flavor::Bash {
            "builtin cd"
        } else {
            "cd"
        },
        dir = quote(start_dir),
    )
}

/// The text the session's shell runs for one command (see the module docs). Between the
/// begin and end markers only the command itself (and `set -x` traces of it) writes.
pub(super) fn wrap(
    flavor: Flavor,
    kind: SessionKind,
    nonce: &str,
    command: &ShellCommand,
    exec_dir: Option<&str>,
) -> String {
    let bash = flavor == Flavor::Bash;
    let (a, b) = nonce.split_at(nonce.len() / 2);
    let printf = if bash {
        "builtin printf"
    } else {
        "command printf"
    };
    let eval = if bash {
        "builtin command eval"
    } else {
        "command eval"
    };
    // The command's stdin is not the script; the markers' descriptors are not its own.
    let closed = "</dev/null 8>&- 9>&-";
    let split = kind == SessionKind::Bash;
    let mut w = String::new();
    // Variables for this command only: saved, set, restored after it.
    let mut restore = String::new();
    for (i, (name, value)) in command.env.iter().enumerate() {
        if bash {
            w.push_str(&format!("__warren_e{i}=${{{name}+${{{name}@A}}}}; "));
            restore.push_str(&format!("unset {name}; builtin eval \"$__warren_e{i}\"; "));
        } else {
            w.push_str(&format!(
                "__warren_s{i}=${{{name}+x}} __warren_v{i}=${{{name}-}}; "
            ));
            restore.push_str(&format!(
                "if [ -n \"$__warren_s{i}\" ]; then {name}=$__warren_v{i}; else unset {name}; fi; "
            ));
        }
        match value {
            Some(value) => w.push_str(&format!("export {name}={}\n", quote(value))),
            None => w.push_str(&format!("unset {name}\n")),
        }
    }
    let quoted = quote(&command.command);
    let risky = bash
        && ["$(", "<(", ">("]
            .iter()
            .any(|open| command.command.contains(open));
    if risky {
        // Parse it in a subshell first (as a function body: parsed, not run); text that
        // would end the shell runs in a subshell of its own instead.
        let check = quote(&format!("__warren_check() {{\n{}\n}}", command.command));
        w.push_str(&format!(
            "if ( builtin eval {check} ) </dev/null >/dev/null 2>&1; then __warren_ok=1; else __warren_ok=; fi\n"
        ));
    }
    // The runtime's clock and the last pid it handed out, to tell this command's processes
    // from earlier ones (see KILL); builtins only, nothing forks.
    w.push_str(
        "IFS=' ' read -r __warren_up __warren_x </proc/uptime 2>/dev/null || __warren_up=\n",
    );
    w.push_str(
        "IFS=' ' read -r __warren_x __warren_x __warren_x __warren_x __warren_pid </proc/loadavg 2>/dev/null || __warren_pid=\n",
    );
    // `set -x` from an earlier command comes back on for this one (see the end below).
    w.push_str("case ${__warren_f-} in *x*) set -x;; esac\n");
    w.push_str(&format!(
        "{printf} '\\036B%s%s\\037%s\\037%s\\0' {a} {b} \"$__warren_up\" \"$__warren_pid\" >&8\n"
    ));
    if split {
        w.push_str(&format!("{printf} '\\036B%s%s\\0' {a} {b} >&9\n"));
    }
    let run = if risky {
        format!(
            "case $__warren_ok in 1) {eval} {quoted} {closed};; *) ( {eval} {quoted} ) {closed};; esac"
        )
    } else {
        format!("{eval} {quoted} {closed}")
    };
    if let Some(dir) = exec_dir {
        w.push_str(&format!(
            "{cd} -- {dir} {closed} && ",
            cd = if bash { "builtin cd" } else { "cd" },
            dir = quote(dir)
        ));
    }
    w.push_str(&run);
    // Silently: `$?` and the flags are kept, tracing stops so nothing of the wrapper shows.
    // On the same line: bash misparses a `{` group on the line after an `eval` whose text
    // ended inside a quote.
    w.push_str(&format!(
        "; {{ __warren_rc=$? __warren_f=$-; set +vx; {restore}}} 2>/dev/null\n"
    ));
    w.push_str(&format!(
        "{printf} '\\036E%s%s\\037%d\\037%s\\0' {a} {b} \"$__warren_rc\" \"$PWD\" >&8\n"
    ));
    if split {
        w.push_str(&format!("{printf} '\\036E%s%s\\0' {a} {b} >&9\n"));
    }
    w
}
