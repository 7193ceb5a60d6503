//! The body of `POST /files`, read into the files it carries.
//!
//! The SDKs send either `multipart/form-data` (one `file` part per file; the part's
//! filename is the destination, unless the `path` query names it) or, for envd 0.5.7 and
//! later, `application/octet-stream` with the destination in `path`, optionally
//! `Content-Encoding: gzip`. The whole body is bounded before anything is parsed, and a
//! gzip body again after decompression, so neither a large upload nor a small bomb can
//! take more memory than the bound.

use std::io::Read as _;

use bytes::Bytes;

/// One file of an upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UploadedFile {
    /// Where it goes, as the client wrote it (the `path` query or the part's filename);
    /// the provisioner parses it (I2).
    pub(crate) path: String,
    /// Its bytes.
    pub(crate) bytes: Bytes,
}

/// Why an upload's body cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UploadError {
    /// The body (or a gzip body once decompressed) exceeds the bound.
    #[error("the upload is larger than {limit} bytes, the most one request may carry")]
    TooLarge {
        /// The bound, in bytes.
        limit: usize,
    },
    /// `Content-Encoding` is neither absent, `identity` nor `gzip`.
    #[error("Content-Encoding {0:?} is not supported; send gzip or an uncompressed body")]
    UnsupportedEncoding(String),
    /// A gzip body does not decompress.
    #[error("the gzip body is corrupt")]
    BadGzip,
    /// The multipart body is malformed.
    #[error("the multipart body is malformed: {0}")]
    Multipart(String),
    /// A file has no destination: no `path` query and no filename on its part.
    #[error("a file has no destination: send the `path` query or a filename on each `file` part")]
    MissingPath,
    /// The multipart body has no `file` part.
    #[error("the multipart body has no `file` part")]
    NoFiles,
    /// Two files of one request go to the same path.
    #[error("you cannot upload multiple files to the same path {0:?} in one request")]
    DuplicatePath(String),
    /// The body could not be read from the connection.
    #[error("the request body could not be read")]
    Body,
}

/// What the request says about its body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyKind<'a> {
    /// `Content-Type`, if any.
    pub(crate) content_type: Option<&'a str>,
    /// `Content-Encoding`, if any.
    pub(crate) content_encoding: Option<&'a str>,
    /// The `path` query, if any.
    pub(crate) path: Option<&'a str>,
}

/// Reads an upload's files from its body, at most `limit` bytes before and after
/// decompression.
pub(crate) async fn read_files(
    kind: BodyKind<'_>,
    body: axum::body::Body,
    limit: usize,
) -> Result<Vec<UploadedFile>, UploadError> {
    let raw = read_bounded(body, limit).await?;
    let raw = decode(kind.content_encoding, raw, limit).await?;
    match kind.content_type.and_then(multipart_boundary) {
        Some(boundary) => parse_multipart(raw, &boundary, kind.path, limit).await,
        None => match kind.path {
            Some(path) => Ok(vec![UploadedFile {
                path: path.to_owned(),
                bytes: raw,
            }]),
            None => Err(UploadError::MissingPath),
        },
    }
}

/// The whole body, refused as soon as it passes `limit` (never buffered past it).
async fn read_bounded(body: axum::body::Body, limit: usize) -> Result<Bytes, UploadError> {
    use futures::StreamExt as _;
    let mut stream = body.into_data_stream();
    let mut collected = bytes::BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| UploadError::Body)?;
        if collected.len().saturating_add(chunk.len()) > limit {
            return Err(UploadError::TooLarge { limit });
        }
        collected.extend_from_slice(&chunk);
    }
    Ok(collected.freeze())
}

/// The boundary of a `multipart/form-data` content type (a type that is not multipart is
/// a raw upload: envd takes any other type as the file's bytes).
fn multipart_boundary(content_type: &str) -> Option<String> {
    let mime = content_type.split(';').next()?.trim();
    if !mime.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    // A multipart type without a boundary still is multipart: multer refuses it below.
    Some(multer::parse_boundary(content_type).unwrap_or_default())
}

/// Undoes `Content-Encoding`, bounded by `limit` (a gzip bomb stops at the bound).
async fn decode(encoding: Option<&str>, raw: Bytes, limit: usize) -> Result<Bytes, UploadError> {
    match encoding.map(str::trim) {
        None | Some("") => Ok(raw),
        Some(name) if name.eq_ignore_ascii_case("identity") => Ok(raw),
        Some(name) if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") => {
            // Decompression is CPU work of up to `limit` bytes: off the async threads.
            tokio::task::spawn_blocking(move || gunzip(&raw, limit))
                .await
                .map_err(|_| UploadError::BadGzip)?
        }
        Some(other) => Err(UploadError::UnsupportedEncoding(crate::error::shorten(
            other,
        ))),
    }
}

/// Decompresses gzip (every member, as `gzip -d` does), at most `limit` bytes.
fn gunzip(raw: &[u8], limit: usize) -> Result<Bytes, UploadError> {
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    flate2::read::MultiGzDecoder::new(raw)
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|_| UploadError::BadGzip)?;
    if out.len() > limit {
        return Err(UploadError::TooLarge { limit });
    }
    Ok(out.into())
}

/// The `file` parts of a multipart body; other fields are skipped, as envd skips them.
async fn parse_multipart(
    raw: Bytes,
    boundary: &str,
    path: Option<&str>,
    limit: usize,
) -> Result<Vec<UploadedFile>, UploadError> {
    let constraints = multer::Constraints::new().size_limit(
        multer::SizeLimit::new()
            .whole_stream(u64::try_from(limit).unwrap_or(u64::MAX))
            .per_field(u64::try_from(limit).unwrap_or(u64::MAX)),
    );
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(raw) });
    let mut multipart = multer::Multipart::with_constraints(stream, boundary, constraints);
    let mut files: Vec<UploadedFile> = Vec::new();
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(error) => return Err(multipart_error(error, limit)),
        };
        if field.name() != Some("file") {
            continue;
        }
        // The `path` query names the destination of every part (envd's rule); a second
        // part to the same path is refused below rather than silently overwriting.
        let destination = match path {
            Some(path) => path.to_owned(),
            None => match field.file_name() {
                Some(name) if !name.is_empty() => name.to_owned(),
                _ => return Err(UploadError::MissingPath),
            },
        };
        if files.iter().any(|file| file.path == destination) {
            return Err(UploadError::DuplicatePath(crate::error::shorten(
                &destination,
            )));
        }
        let bytes = field
            .bytes()
            .await
            .map_err(|error| multipart_error(error, limit))?;
        files.push(UploadedFile {
            path: destination,
            bytes,
        });
    }
    if files.is_empty() {
        return Err(UploadError::NoFiles);
    }
    Ok(files)
}

/// A multer failure: the bound, or a malformed body.
fn multipart_error(error: multer::Error, limit: usize) -> UploadError {
    match error {
        multer::Error::StreamSizeExceeded { .. } | multer::Error::FieldSizeExceeded { .. } => {
            UploadError::TooLarge { limit }
        }
        other => UploadError::Multipart(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    const LIMIT: usize = 1024;

    fn multipart(parts: &[(&str, Option<&str>, &str)]) -> String {
        let mut body = String::new();
        for (name, filename, content) in parts {
            body.push_str("--XyZ\r\n");
            match filename {
                Some(file) => body.push_str(&format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\n"
                )),
                None => body.push_str(&format!(
                    "Content-Disposition: form-data; name=\"{name}\"\r\n"
                )),
            }
            body.push_str("Content-Type: application/octet-stream\r\n\r\n");
            body.push_str(content);
            body.push_str("\r\n");
        }
        body.push_str("--XyZ--\r\n");
        body
    }

    async fn read(
        content_type: &str,
        encoding: Option<&str>,
        path: Option<&str>,
        body: impl Into<axum::body::Body>,
    ) -> Result<Vec<UploadedFile>, UploadError> {
        let kind = BodyKind {
            content_type: Some(content_type),
            content_encoding: encoding,
            path,
        };
        read_files(kind, body.into(), LIMIT).await
    }

    const FORM: &str = "multipart/form-data; boundary=XyZ";

    fn file(path: &str, bytes: &str) -> UploadedFile {
        UploadedFile {
            path: path.to_owned(),
            bytes: Bytes::copy_from_slice(bytes.as_bytes()),
        }
    }

    #[tokio::test]
    async fn each_file_part_goes_to_its_filename_without_a_path_query() {
        let body = multipart(&[
            ("file", Some("a.txt"), "one"),
            ("note", None, "ignored"),
            ("file", Some("/home/user/dir/b.txt"), "two"),
        ]);
        assert_eq!(
            read(FORM, None, None, body).await,
            Ok(vec![
                file("a.txt", "one"),
                file("/home/user/dir/b.txt", "two")
            ])
        );
    }

    #[tokio::test]
    async fn the_path_query_names_the_destination_of_a_single_part() {
        let body = multipart(&[("file", Some("ignored.txt"), "x")]);
        assert_eq!(
            read(FORM, None, Some("/home/user/t.txt"), body).await,
            Ok(vec![file("/home/user/t.txt", "x")])
        );
    }

    #[tokio::test]
    async fn two_parts_to_one_path_are_refused() {
        let body = multipart(&[("file", Some("a"), "1"), ("file", Some("b"), "2")]);
        assert_eq!(
            read(FORM, None, Some("same.txt"), body).await,
            Err(UploadError::DuplicatePath("same.txt".into()))
        );
        let body = multipart(&[("file", Some("a"), "1"), ("file", Some("a"), "2")]);
        assert_eq!(
            read(FORM, None, None, body).await,
            Err(UploadError::DuplicatePath("a".into()))
        );
    }

    #[tokio::test]
    async fn a_part_without_filename_or_path_and_a_body_without_files_are_refused() {
        let body = multipart(&[("file", None, "x")]);
        assert_eq!(
            read(FORM, None, None, body).await,
            Err(UploadError::MissingPath)
        );
        let body = multipart(&[("other", Some("a"), "x")]);
        assert_eq!(
            read(FORM, None, None, body).await,
            Err(UploadError::NoFiles)
        );
    }

    #[tokio::test]
    async fn a_malformed_multipart_body_is_refused() {
        let truncated =
            "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc";
        assert!(matches!(
            read(FORM, None, None, truncated).await,
            Err(UploadError::Multipart(_))
        ));
        let no_boundary = multipart(&[("file", Some("a"), "x")]);
        assert!(matches!(
            read("multipart/form-data", None, None, no_boundary).await,
            Err(UploadError::Multipart(_))
        ));
    }

    #[tokio::test]
    async fn an_octet_stream_upload_needs_the_path_query() {
        assert_eq!(
            read("application/octet-stream", None, Some("f.bin"), "raw").await,
            Ok(vec![file("f.bin", "raw")])
        );
        assert_eq!(
            read("application/octet-stream", None, None, "raw").await,
            Err(UploadError::MissingPath)
        );
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[tokio::test]
    async fn a_gzip_body_is_decompressed_within_the_bound() {
        assert_eq!(
            read(
                "application/octet-stream",
                Some("gzip"),
                Some("f"),
                gzip(b"hello")
            )
            .await,
            Ok(vec![file("f", "hello")])
        );
        // A few hundred bytes that inflate past the bound stop at the bound.
        let bomb = gzip(&vec![0; LIMIT * 64]);
        assert!(bomb.len() < LIMIT);
        assert_eq!(
            read("application/octet-stream", Some("gzip"), Some("f"), bomb).await,
            Err(UploadError::TooLarge { limit: LIMIT })
        );
        assert_eq!(
            read("application/octet-stream", Some("gzip"), Some("f"), "nope").await,
            Err(UploadError::BadGzip)
        );
        assert!(matches!(
            read("application/octet-stream", Some("br"), Some("f"), "x").await,
            Err(UploadError::UnsupportedEncoding(_))
        ));
    }

    #[tokio::test]
    async fn a_body_over_the_bound_is_refused() {
        let big = "x".repeat(LIMIT + 1);
        assert_eq!(
            read("application/octet-stream", None, Some("f"), big.clone()).await,
            Err(UploadError::TooLarge { limit: LIMIT })
        );
        let body = multipart(&[("file", Some("a"), &big)]);
        assert_eq!(
            read(FORM, None, None, body).await,
            Err(UploadError::TooLarge { limit: LIMIT })
        );
    }
}
