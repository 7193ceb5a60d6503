//! What the Viewer shows of a file: text, Markdown rendered and sanitised on the server,
//! images and PDFs by reference, and nothing but a download for active content (I17).

use serde::Serialize;

/// Most bytes of a file the Viewer previews as text or Markdown.
pub(crate) const PREVIEW_BYTES: u64 = 1024 * 1024;

/// A preview, as the page renders it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Preview {
    /// Plain text.
    Text { text: String, truncated: bool },
    /// Markdown: sanitised HTML, and the source.
    Markdown { html: String, text: String },
    /// An image: the page shows the raw URL in an `<img>`.
    Image,
    /// A PDF: the page shows the raw URL in a frame.
    Pdf,
    /// No preview, and why.
    None { reason: String },
}

/// How a file of this media type is previewed, before its bytes are read.
pub(crate) enum PreviewKind {
    /// Read the head and show it as text (or as Markdown).
    Text {
        markdown: bool,
    },
    Image,
    Pdf,
    /// Never rendered: offered as a download only.
    DownloadOnly(&'static str),
}

pub(crate) fn kind_of(media_type: &str) -> PreviewKind {
    match media_type {
        "image/png" | "image/jpeg" | "image/gif" | "image/webp" => PreviewKind::Image,
        "application/pdf" => PreviewKind::Pdf,
        "text/markdown" => PreviewKind::Text { markdown: true },
        _ if warren_provisioner::is_active_content(media_type) => PreviewKind::DownloadOnly(
            "markup a browser would run (HTML, SVG, XML) is offered as a download only",
        ),
        _ => PreviewKind::Text { markdown: false },
    }
}

/// The preview of the first bytes of a file of `total` bytes, read as text.
pub(crate) fn text_preview(bytes: &[u8], total: u64, markdown: bool) -> Preview {
    if bytes.iter().take(8192).any(|b| *b == 0) {
        return Preview::None {
            reason: "a binary file; download it to look inside".into(),
        };
    }
    let truncated = total > bytes.len() as u64;
    let text = String::from_utf8_lossy(bytes).into_owned();
    if markdown && !truncated {
        return Preview::Markdown {
            html: render_markdown(&text),
            text,
        };
    }
    Preview::Text { text, truncated }
}

/// CommonMark (with tables, strikethrough and task lists) to HTML, then sanitised with
/// ammonia: no script, no event handler, no `javascript:` URL, no style, no frame. Links
/// get `rel="noopener noreferrer"`; images may only come from the Viewer itself (the page's
/// CSP says so too), so a document cannot beacon out.
pub(crate) fn render_markdown(source: &str) -> String {
    use pulldown_cmark::{html, Options, Parser};
    let options =
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let mut unsafe_html = String::new();
    html::push_html(&mut unsafe_html, Parser::new_ext(source, options));
    ammonia::Builder::default()
        .link_rel(Some("noopener noreferrer nofollow"))
        .url_schemes(["http", "https", "mailto"].into_iter().collect())
        .clean(&unsafe_html)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_is_rendered_and_scripts_handlers_and_javascript_urls_are_gone() {
        let html = render_markdown(
            "# Title\n\n<script>alert(1)</script>\n\n<img src=x onerror=alert(2)>\n\n\
             [click](javascript:alert(3)) *ok*\n\n| a | b |\n|---|---|\n| 1 | 2 |\n",
        );
        assert!(html.contains("<h1>Title</h1>"), "{html}");
        assert!(html.contains("<em>ok</em>"), "{html}");
        assert!(html.contains("<table>"), "{html}");
        for bad in ["<script", "onerror", "javascript:", "alert(1)"] {
            assert!(!html.contains(bad), "{bad} survived: {html}");
        }
    }

    #[test]
    fn binary_files_get_no_text_preview_and_long_ones_say_they_are_cut() {
        assert!(matches!(
            text_preview(b"a\0b", 3, false),
            Preview::None { .. }
        ));
        assert_eq!(
            text_preview(b"abc", 10, false),
            Preview::Text {
                text: "abc".into(),
                truncated: true
            }
        );
        // A cut Markdown file is shown as text rather than rendered half.
        assert!(matches!(
            text_preview(b"# a", 10, true),
            Preview::Text { .. }
        ));
    }

    #[test]
    fn active_content_is_download_only() {
        for kind in ["text/html", "image/svg+xml", "application/xhtml+xml"] {
            assert!(
                matches!(kind_of(kind), PreviewKind::DownloadOnly(_)),
                "{kind}"
            );
        }
        assert!(matches!(kind_of("image/png"), PreviewKind::Image));
    }
}
