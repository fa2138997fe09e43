//! Shared test helpers: the sample data (from the example) and checkers for the HTML.
#![allow(dead_code)]

#[path = "../../examples/sample.rs"]
pub mod sample;

use quick_xml::Reader;
use quick_xml::events::Event;

/// Every external reference in `html`: anything a browser could fetch or follow off the page.
/// `http(s)://` is allowed only as the value of an `xmlns`/`xmlns:*` attribute (a namespace
/// name, never fetched); `href` only as an in-page `#fragment`.
pub fn external_references(html: &str) -> Vec<String> {
    let lower = html.to_ascii_lowercase();
    let mut found = Vec::new();
    let context = |at: usize| html[at.saturating_sub(40)..(at + 60).min(html.len())].to_owned();
    for scheme in ["http://", "https://", "//cdn", "ftp://", "file:"] {
        for (at, _) in lower.match_indices(scheme) {
            let before = &lower[..at];
            let is_namespace = before.ends_with("xmlns=\"") || {
                // xmlns:xlink="http://..."
                let attr_start = before.rfind(char::is_whitespace).map_or(0, |i| i + 1);
                let attr = &before[attr_start..];
                attr.starts_with("xmlns:") && attr.ends_with("=\"")
            };
            if !is_namespace {
                found.push(format!("{scheme} at {at}: {}", context(at)));
            }
        }
    }
    for needle in [
        "src=",
        "<link",
        "@import",
        "url(",
        "<script",
        "<iframe",
        "<object",
        "<embed",
        "srcset=",
        "xlink:href",
        "@font-face",
    ] {
        for (at, _) in lower.match_indices(needle) {
            found.push(format!("{needle} at {at}: {}", context(at)));
        }
    }
    for (at, _) in lower.match_indices("href=") {
        let value = &lower[at + 5..];
        if !(value.starts_with("\"#") || value.starts_with("'#")) {
            found.push(format!("href at {at}: {}", context(at)));
        }
    }
    found
}

const VOID: [&str; 14] = [
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
    "track", "wbr",
];

/// Checks that every tag of `html` is closed in order (void elements and `<x/>` excepted),
/// skipping the raw text of `<style>`. Returns the first problem.
pub fn check_balanced(html: &str) -> Result<(), String> {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = html;
    let mut offset = 0;
    while let Some(lt) = rest.find('<') {
        let tag_start = offset + lt;
        rest = &rest[lt..];
        if rest.starts_with("<!--") {
            let end = rest
                .find("-->")
                .ok_or(format!("unclosed comment at {tag_start}"))?;
            offset = tag_start + end + 3;
            rest = &rest[end + 3..];
            continue;
        }
        // Find the closing '>' outside quotes.
        let mut quote = None;
        let mut end = None;
        for (i, c) in rest.char_indices().skip(1) {
            match (quote, c) {
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (None, '>') => {
                    end = Some(i);
                    break;
                }
                (None, '<') => return Err(format!("'<' inside a tag at {}", offset + i)),
                _ => {}
            }
        }
        let end = end.ok_or(format!("unterminated tag at {tag_start}"))?;
        let inner = &rest[1..end];
        offset = tag_start + end + 1;
        rest = &rest[end + 1..];
        if inner.starts_with('!') || inner.starts_with('?') {
            continue;
        }
        if let Some(name) = inner.strip_prefix('/') {
            let name = name.trim().to_ascii_lowercase();
            match stack.pop() {
                Some(open) if open == name => {}
                Some(open) => return Err(format!("</{name}> closes <{open}> at {tag_start}")),
                None => return Err(format!("</{name}> without an open tag at {tag_start}")),
            }
            continue;
        }
        let name: String = inner
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '/')
            .collect::<String>()
            .to_ascii_lowercase();
        if name.is_empty() {
            return Err(format!("empty tag at {tag_start}"));
        }
        if inner.ends_with('/') || VOID.contains(&name.as_str()) {
            continue;
        }
        if name == "style" || name == "script" {
            let close = format!("</{name}>");
            let end = rest
                .find(&close)
                .ok_or(format!("unclosed <{name}> at {tag_start}"))?;
            offset += end + close.len();
            rest = &rest[end + close.len()..];
            continue;
        }
        stack.push(name);
    }
    if stack.is_empty() {
        Ok(())
    } else {
        Err(format!("unclosed tags: {stack:?}"))
    }
}

/// The `<svg>…</svg>` elements of `html` (not nested in this crate's output).
pub fn svgs(html: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find("<svg") {
        let Some(len) = rest[start..].find("</svg>") else {
            break;
        };
        out.push(&rest[start..start + len + "</svg>".len()]);
        rest = &rest[start + len + 6..];
    }
    out
}

/// Parses `svg` as strict XML with quick-xml (end tags must match); returns the element count.
pub fn parse_xml(svg: &str) -> Result<usize, String> {
    let mut reader = Reader::from_str(svg);
    let mut depth: i64 = 0;
    let mut elements = 0;
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => {
                depth += 1;
                elements += 1;
                check_attributes(&e)?;
            }
            Ok(Event::Empty(e)) => {
                elements += 1;
                check_attributes(&e)?;
            }
            Ok(Event::GeneralRef(r)) => {
                let name = r
                    .decode()
                    .map_err(|e| format!("bad reference: {e}"))?
                    .into_owned();
                let known = ["lt", "gt", "amp", "quot", "apos"].contains(&name.as_str());
                if !known && !r.is_char_ref() {
                    return Err(format!("unknown entity &{name};"));
                }
            }
            Ok(Event::End(_)) => depth -= 1,
            Ok(Event::Eof) => break,
            Ok(Event::Text(t)) => {
                t.decode().map_err(|e| format!("bad text: {e}"))?;
            }
            Ok(_) => {}
            Err(e) => return Err(format!("at {}: {e}", reader.error_position())),
        }
    }
    if depth == 0 {
        Ok(elements)
    } else {
        Err(format!("unbalanced: depth {depth} at end"))
    }
}

fn check_attributes(e: &quick_xml::events::BytesStart<'_>) -> Result<(), String> {
    for attr in e.attributes() {
        let attr = attr.map_err(|err| format!("bad attribute: {err}"))?;
        attr.normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|err| format!("bad attribute value: {err}"))?;
    }
    Ok(())
}
