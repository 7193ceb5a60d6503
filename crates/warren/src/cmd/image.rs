//! `warren image import`: an OCI image layout (directory or archive) becomes a root
//! filesystem under `<data-dir>/images/<name>/rootfs`, for `warren serve --image <name>`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Import an OCI image layout directory or archive (e.g. from `docker save` or
    /// `skopeo copy … oci-archive:image.tar`).
    Import {
        /// The layout directory or archive.
        source: PathBuf,
        /// The name to serve it under: [a-z0-9][a-z0-9._-]{0,63}.
        #[arg(long)]
        name: String,
        /// warren's data directory (as for `warren serve`).
        #[arg(long, env = "WARREN_DATA_DIR")]
        data_dir: Option<PathBuf>,
    },
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let valid = name.len() <= 64
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if !valid {
        bail!("invalid image name {name:?}: use lowercase letters, digits, '.', '_' and '-' (at most 64)");
    }
    Ok(())
}

/// The root filesystem of an imported image, which must exist.
pub fn rootfs_of(data_dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    let rootfs = data_dir.join("images").join(name).join("rootfs");
    if !rootfs.is_dir() {
        bail!(
            "no image {name:?} in {}; import one with `warren image import <layout> --name {name}`",
            data_dir.display()
        );
    }
    Ok(rootfs)
}

pub fn run(args: ImageArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ImageCommand::Import {
            source,
            name,
            data_dir,
        } => {
            check_name(&name)?;
            let data_dir = match data_dir {
                Some(dir) => dir,
                None => super::serve::default_data_dir()?,
            };
            let target = data_dir.join("images").join(&name).join("rootfs");
            let report = warren_image::import(&source, &target)
                .with_context(|| format!("cannot import {} as {name:?}", source.display()))?;
            super::output::line(format_args!(
                "imported {name}: {} layers, {} entries, {} bytes ({} special files skipped)",
                report.layers, report.entries, report.bytes, report.skipped
            ))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
