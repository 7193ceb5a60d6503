//! `filesystem.Filesystem`: Stat, MakeDir, Move, ListDir, Remove and the directory
//! watches, each handed to the provisioner's file functions by virtual path on the
//! sandbox's warren id (I2: `warren-fs` resolves every path by descriptor and refuses
//! `..`, links and paths outside the mounts; nothing here checks or builds host paths).
//! Failures carry the provisioner's public message, virtual paths only (I1).

use std::future::Future;

use axum::response::Response;

use super::connect::{Call, Code, ConnectError, Message};
use super::fs::entry::entry_info;
use super::fs::{check_user, connect_error, expand_home, is_not_found, HOME};
use super::proto::filesystem::{
    ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse, MoveRequest, MoveResponse,
    RemoveRequest, RemoveResponse, StatRequest, StatResponse,
};
use super::{watch, EnvdContext};

/// The most entries one `ListDir` answers. envd has no bound; warren refuses a listing
/// past it (rather than cutting it silently), so one call cannot build an answer of
/// unbounded size.
pub(crate) const MAX_LIST_ENTRIES: usize = 50_000;

/// Serves one call of `filesystem.Filesystem`.
pub(crate) async fn serve(ctx: EnvdContext, method: &str, mut call: Call) -> Response {
    let streaming = match method {
        "WatchDir" => true,
        "Stat" | "MakeDir" | "Move" | "ListDir" | "Remove" | "CreateWatcher"
        | "GetWatcherEvents" | "RemoveWatcher" => false,
        other => {
            return call.error(ConnectError::new(
                Code::Unimplemented,
                format!(
                    "filesystem.Filesystem/{} is not a method",
                    crate::error::shorten(other)
                ),
            ))
        }
    };
    if let Err(response) = call.require_streaming(streaming) {
        return response;
    }
    if let Err(unknown) = check_user(ctx.user.as_deref()) {
        return call.error(ConnectError::new(
            Code::Unauthenticated,
            unknown.to_string(),
        ));
    }
    match method {
        "Stat" => answer(&mut call, |request| stat(ctx, request)).await,
        "MakeDir" => answer(&mut call, |request| make_dir(ctx, request)).await,
        "Move" => answer(&mut call, |request| move_entry(ctx, request)).await,
        "ListDir" => answer(&mut call, |request| list_dir(ctx, request)).await,
        "Remove" => answer(&mut call, |request| remove(ctx, request)).await,
        "CreateWatcher" => answer(&mut call, |request| watch::create_watcher(ctx, request)).await,
        "GetWatcherEvents" => {
            answer(&mut call, |request| watch::get_watcher_events(ctx, request)).await
        }
        "RemoveWatcher" => answer(&mut call, |request| watch::remove_watcher(ctx, request)).await,
        _ => watch::watch_dir(ctx, call).await,
    }
}

/// Reads a unary call's request, runs `handler` and answers its result.
async fn answer<Req, Res, F, Fut>(call: &mut Call, handler: F) -> Response
where
    Req: Message,
    Res: Message,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Res, ConnectError>>,
{
    let request = match call.message::<Req>().await {
        Ok(request) => request,
        Err(error) => return call.error(error),
    };
    match handler(request).await {
        Ok(response) => call.unary(&response),
        Err(error) => call.error(error),
    }
}

/// `Stat`: one entry, never following a link (I2).
async fn stat(ctx: EnvdContext, request: StatRequest) -> Result<StatResponse, ConnectError> {
    let found = ctx
        .shared
        .provisioner
        // A link is described, not followed, as E2B's envd does.
        .describe(&ctx.sandbox.warren_id, &expand_home(&request.path))
        .await
        .map_err(connect_error)?;
    Ok(StatResponse {
        entry: Some(entry_info(&found.path, &found.value)),
    })
}

/// `MakeDir`: the directory and its missing parents; one that exists is
/// `already_exists`, which the SDKs turn into `make_dir` answering false.
async fn make_dir(
    ctx: EnvdContext,
    request: MakeDirRequest,
) -> Result<MakeDirResponse, ConnectError> {
    let provisioner = &ctx.shared.provisioner;
    let id = &ctx.sandbox.warren_id;
    let path = expand_home(&request.path);
    let made = provisioner.mkdir(id, &path).await.map_err(connect_error)?;
    if !made.value {
        return Err(ConnectError::new(
            Code::AlreadyExists,
            format!("{}: the directory already exists", made.path),
        ));
    }
    let found = provisioner.stat(id, &path).await.map_err(connect_error)?;
    Ok(MakeDirResponse {
        entry: Some(entry_info(&found.path, &found.value)),
    })
}

/// `Move`: renames an entry, replacing a destination file as `rename(2)` does, after
/// making the destination's missing parent directories (envd does both).
async fn move_entry(ctx: EnvdContext, request: MoveRequest) -> Result<MoveResponse, ConnectError> {
    let provisioner = &ctx.shared.provisioner;
    let id = &ctx.sandbox.warren_id;
    let source = expand_home(&request.source);
    let destination = expand_home(&request.destination);
    refuse_home(&ctx, &source, "moved").await?;
    refuse_home(&ctx, &destination, "replaced").await?;
    // The parent is named in the runtime's terms (a parsed virtual path) and handed back
    // to the provisioner, which resolves it by descriptor like any other path (I2).
    let resolved = provisioner
        .resolve_path(id, &destination)
        .await
        .map_err(connect_error)?
        .to_string();
    if let Some((parent, _)) = resolved.rsplit_once('/') {
        if !parent.is_empty() {
            provisioner.mkdir(id, parent).await.map_err(connect_error)?;
        }
    }
    provisioner
        .rename(id, &source, &destination, true)
        .await
        .map_err(connect_error)?;
    let found = provisioner
        .stat(id, &destination)
        .await
        .map_err(connect_error)?;
    Ok(MoveResponse {
        entry: Some(entry_info(&found.path, &found.value)),
    })
}

/// `ListDir`: the directory's entries down to `depth` (0 is 1, as in envd), links listed
/// as themselves and never followed (I2).
async fn list_dir(
    ctx: EnvdContext,
    request: ListDirRequest,
) -> Result<ListDirResponse, ConnectError> {
    let listing = ctx
        .shared
        .provisioner
        .list(
            &ctx.sandbox.warren_id,
            &expand_home(&request.path),
            request.depth.max(1),
            MAX_LIST_ENTRIES,
        )
        .await
        .map_err(connect_error)?;
    if listing.value.truncated {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "{}: more than {MAX_LIST_ENTRIES} entries; list with a smaller depth",
                listing.path
            ),
        ));
    }
    let entries = listing
        .value
        .entries
        .iter()
        .map(|entry| entry_info(&listing.path, entry))
        .collect();
    Ok(ListDirResponse { entries })
}

/// `Remove`: a file, link or whole tree. Like envd's `os.RemoveAll`, a path that does not
/// exist is already removed.
async fn remove(ctx: EnvdContext, request: RemoveRequest) -> Result<RemoveResponse, ConnectError> {
    let path = expand_home(&request.path);
    refuse_home(&ctx, &path, "removed").await?;
    match ctx
        .shared
        .provisioner
        .remove(&ctx.sandbox.warren_id, &path, true)
        .await
    {
        Ok(_) => Ok(RemoveResponse {}),
        Err(error) if is_not_found(&error) => Ok(RemoveResponse {}),
        Err(error) => Err(connect_error(error)),
    }
}

/// Refuses to remove, move or replace the home directory itself. The E2B layout shows the
/// sandbox's workdir *as* `/home/user`, so the file layer would act on the workdir
/// directory (its root refusal guards only the whole workspace): removing it would leave
/// the sandbox without its mount. This is an additional fence on the parsed path, not a
/// replacement for the file layer's resolution (I2), which still handles every other path.
async fn refuse_home(ctx: &EnvdContext, path: &str, action: &str) -> Result<(), ConnectError> {
    let resolved = ctx
        .shared
        .provisioner
        .resolve_path(&ctx.sandbox.warren_id, path)
        .await
        .map_err(connect_error)?;
    if resolved.to_string() == HOME {
        return Err(ConnectError::new(
            Code::PermissionDenied,
            format!("{HOME}: the home directory itself cannot be {action}"),
        ));
    }
    Ok(())
}
