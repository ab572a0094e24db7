//! A linear bound on how deeply YAML (or JSON) text nests, checked before any parser sees it.
//!
//! The YAML parser shoal used before (libyaml, behind `serde_yaml`) spent time quadratic in
//! the nesting depth before its own recursion limit could refuse anything: a 195 KiB file of
//! 100 000 nested `[` kept it busy for 25 s, and everything else the process does with it.
//! `serde-saphyr` ([`crate::yaml`]) refuses such text fast with its depth budget; this check
//! stays in front of every parser, so whichever reads the text, its cost stays linear and
//! the error names the document and line. [`check`] reads the text once, counting flow
//! collections (`[`, `{`) and block levels (indentation and `- ` / `? ` entries) as the YAML
//! scanner would, skipping quoted scalars, block scalars and comments, and refuses text
//! that nests deeper than a limit.
//!
//! It counts conservatively: a line that continues a multi-line plain scalar may count as
//! a level, and so may a scalar after `- `. It never counts fewer levels than a parser
//! opens (collections only open where this scanner counts one). [`MAX_DEPTH`] is far above
//! what real objects use (Kubernetes and Istio objects nest about 15 levels) and not above
//! the parsers' own limits (`serde_json`'s recursion limit of 128, the same 100 in
//! [`crate::yaml`]'s budget), so a file this check refuses is one a parser would have
//! refused too, maybe slower.

/// The nesting depth [`check`] is used with: deeper text is refused.
pub const MAX_DEPTH: usize = 100;

/// Text that nests deeper than the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("document {document}, line {line}: nested deeper than {limit} levels")]
pub struct TooDeep {
    /// Index (from 0) of the YAML document where the limit was passed.
    pub document: usize,
    /// Line (from 1) where the limit was passed.
    pub line: usize,
    /// The limit.
    pub limit: usize,
}

/// Refuses `text` if it nests deeper than `limit` collections; one pass, constant work per
/// byte.
pub fn check(text: &str, limit: usize) -> Result<(), TooDeep> {
    let mut scanner = Scanner {
        limit,
        document: 0,
        content: false,
        line: 0,
        block: Vec::new(),
        flow: Vec::new(),
        token_start: false,
        json_key: false,
        node_col: None,
        quote: None,
        block_scalar: None,
        plain_continues: false,
    };
    for (index, line) in text.split('\n').enumerate() {
        scanner.line = index + 1;
        // libyaml also breaks lines at CR, NEL, LS and PS: an indentation only this scanner
        // missed would hide block levels from it.
        for part in line.split(['\r', '\u{85}', '\u{2028}', '\u{2029}']) {
            scanner.scan_line(part.as_bytes())?;
        }
    }
    Ok(())
}

/// What opened a block level: a `- ` entry, or a mapping key (or `? `).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Seq,
    Map,
}

/// Where the scanner is within a line.
#[derive(Debug, Clone, Copy)]
enum At {
    /// Where a block node may start. `entry`: at the start of a line's content or after a
    /// `- ` or `? ` there, where an entry opens a level.
    Node { entry: bool },
    /// In a plain scalar of the block context.
    Plain,
    /// After a quoted scalar, an alias or a flow collection of the block context.
    AfterScalar,
    /// Inside a flow collection.
    Flow,
}

/// Where block scalar content ends: at the first non-blank line indented less than
/// `indent` (detected from the first content line, at least `min`).
#[derive(Debug, Clone, Copy)]
struct BlockScalar {
    min: usize,
    indent: Option<usize>,
}

struct Scanner {
    limit: usize,
    document: usize,
    /// The current document has content (a `---` after it starts the next one).
    content: bool,
    line: usize,
    /// Open block levels: (column, kind), innermost last; the columns are the YAML
    /// scanner's indentation levels.
    block: Vec<(usize, Kind)>,
    /// Open flow collections, innermost last: `[` (a sequence) or `{`, and whether the
    /// sequence's current entry is a single-pair mapping (`[a: b]`: the `:` opens a level
    /// the parser builds, until the entry ends at `,` or `]`).
    flow: Vec<Flow>,
    /// Inside a flow collection: whether a quote here starts a quoted scalar (a token
    /// starts here), and whether the previous token was quoted or a collection, so a `:`
    /// right after it is a value indicator even without a space (JSON's `"a":"b"`).
    /// Carried across lines: a plain scalar of a flow collection may go on on the next.
    token_start: bool,
    json_key: bool,
    /// Column of the node being scanned in the block context (a key's level opens there
    /// when `: ` follows).
    node_col: Option<usize>,
    /// A quoted scalar open across lines (its quote character).
    quote: Option<u8>,
    /// Inside a block scalar (`|`, `>`).
    block_scalar: Option<BlockScalar>,
    /// The last line ended inside a plain scalar of the block context: a more indented
    /// line goes on with it (where a quote or a bracket is just text).
    plain_continues: bool,
}

/// An open flow collection.
#[derive(Debug, Clone, Copy)]
struct Flow {
    seq: bool,
    pair: bool,
}

fn is_blank(b: Option<&u8>) -> bool {
    matches!(b, None | Some(b' ' | b'\t'))
}

impl Scanner {
    fn check_depth(&self) -> Result<(), TooDeep> {
        let flow: usize = self.flow.iter().map(|f| 1 + usize::from(f.pair)).sum();
        if self.block.len() + flow > self.limit {
            return Err(TooDeep {
                document: self.document,
                line: self.line,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// The innermost block level's column (`None` at top level).
    fn parent(&self) -> Option<usize> {
        self.block.last().map(|&(col, _)| col)
    }

    /// A block entry of `kind` at `col`: closes deeper levels, continues or opens one.
    fn enter(&mut self, col: usize, kind: Kind) -> Result<(), TooDeep> {
        while let Some(&(c, k)) = self.block.last() {
            // A key at a sequence's column ends the sequence (a sequence may sit at its
            // parent key's column).
            if c > col || (c == col && k == Kind::Seq && kind == Kind::Map) {
                self.block.pop();
            } else {
                break;
            }
        }
        match self.block.last() {
            Some(&(c, k)) if c == col && k == kind => Ok(()),
            _ => {
                self.block.push((col, kind));
                self.check_depth()
            }
        }
    }

    fn open_flow(&mut self, seq: bool) -> Result<(), TooDeep> {
        self.flow.push(Flow { seq, pair: false });
        self.token_start = true;
        self.json_key = false;
        self.check_depth()
    }

    fn scan_line(&mut self, b: &[u8]) -> Result<(), TooDeep> {
        let indent = b.iter().take_while(|&&c| c == b' ').count();
        let blank = b[indent..].iter().all(|&c| c == b' ' || c == b'\t');
        if let Some(scalar) = &mut self.block_scalar {
            if blank {
                return Ok(());
            }
            match scalar.indent {
                Some(n) if indent >= n => return Ok(()),
                None if indent >= scalar.min => {
                    scalar.indent = Some(indent);
                    return Ok(());
                }
                _ => self.block_scalar = None,
            }
        }
        // Document markers, at column 0 (the YAML scanner ends anything open there).
        if (b.starts_with(b"---") || b.starts_with(b"...")) && is_blank(b.get(3)) {
            if self.content {
                self.document += 1;
                self.content = false;
            }
            self.block.clear();
            self.flow.clear();
            self.quote = None;
            self.plain_continues = false;
            self.node_col = None;
            self.content = !b[3..].trim_ascii().is_empty();
            return self.scan(b, 3, At::Node { entry: false });
        }
        if let Some(q) = self.quote {
            let Some(end) = close_quote(b, 0, q) else {
                return Ok(());
            };
            self.quote = None;
            let at = if !self.flow.is_empty() {
                self.token_start = false;
                self.json_key = true;
                At::Flow
            } else {
                At::AfterScalar
            };
            return self.scan(b, end, at);
        }
        if !self.flow.is_empty() {
            return self.scan(b, 0, At::Flow);
        }
        if blank {
            return Ok(());
        }
        if b[indent] == b'#' {
            // A comment ends a plain scalar.
            self.plain_continues = false;
            return Ok(());
        }
        if indent == 0 && b[0] == b'%' {
            return Ok(());
        }
        self.content = true;
        if self.plain_continues && self.parent().is_none_or(|p| indent > p) {
            return self.scan(b, indent, At::Plain);
        }
        self.node_col = None;
        self.scan(b, indent, At::Node { entry: true })
    }

    fn scan(&mut self, b: &[u8], mut i: usize, mut at: At) -> Result<(), TooDeep> {
        self.plain_continues = false;
        while i < b.len() {
            let c = b[i];
            match at {
                At::Node { entry } => {
                    if c == b' ' || c == b'\t' {
                        i += 1;
                        continue;
                    }
                    if c == b'#' {
                        return Ok(());
                    }
                    let indicator = matches!(c, b'-' | b'?' | b':') && is_blank(b.get(i + 1));
                    if indicator {
                        // Counted wherever it is: an entry the parser refuses costs a
                        // level here, never a level missed.
                        let kind = if c == b'-' { Kind::Seq } else { Kind::Map };
                        self.enter(i, kind)?;
                        self.node_col = None;
                        at = At::Node {
                            entry: entry && c != b':',
                        };
                        i += 1;
                        continue;
                    }
                    if self.node_col.is_none() {
                        self.node_col = Some(i);
                    }
                    match c {
                        b'[' | b'{' => {
                            self.open_flow(c == b'[')?;
                            at = At::Flow;
                        }
                        b'\'' | b'"' => {
                            let Some(end) = close_quote(b, i + 1, c) else {
                                self.quote = Some(c);
                                return Ok(());
                            };
                            i = end;
                            at = At::AfterScalar;
                            continue;
                        }
                        b'|' | b'>' => {
                            self.start_block_scalar(&b[i + 1..]);
                            return Ok(());
                        }
                        // Anchors and tags come before the node they describe; an alias
                        // is a node.
                        b'&' | b'!' | b'*' => {
                            while i < b.len() && !is_blank(b.get(i)) {
                                i += 1;
                            }
                            at = if c == b'*' {
                                At::AfterScalar
                            } else {
                                At::Node { entry: false }
                            };
                            continue;
                        }
                        _ => at = At::Plain,
                    }
                    i += 1;
                }
                At::Plain => {
                    if c == b':' && is_blank(b.get(i + 1)) {
                        self.key()?;
                        at = At::Node { entry: false };
                    } else if (c == b' ' || c == b'\t') && b.get(i + 1) == Some(&b'#') {
                        return Ok(());
                    }
                    i += 1;
                }
                At::AfterScalar => {
                    match c {
                        b' ' | b'\t' => {}
                        b'#' => return Ok(()),
                        b':' if is_blank(b.get(i + 1)) => {
                            self.key()?;
                            at = At::Node { entry: false };
                        }
                        _ => at = At::Plain,
                    }
                    i += 1;
                }
                At::Flow => {
                    let (token_start, json_key) = (self.token_start, self.json_key);
                    let (mut next_start, mut next_key) = (false, false);
                    match c {
                        b'[' | b'{' => {
                            self.open_flow(c == b'[')?;
                            i += 1;
                            continue;
                        }
                        b']' | b'}' => {
                            self.flow.pop();
                            if self.flow.is_empty() {
                                at = At::AfterScalar;
                                i += 1;
                                continue;
                            }
                            next_key = true;
                        }
                        b',' => {
                            if let Some(f) = self.flow.last_mut() {
                                f.pair = false;
                            }
                            next_start = true;
                        }
                        b':' | b'?' if json_key || is_blank(b.get(i + 1)) => {
                            // In a sequence, a key makes the entry a single-pair mapping.
                            if let Some(f) = self.flow.last_mut() {
                                if f.seq && !f.pair {
                                    f.pair = true;
                                    self.check_depth()?;
                                }
                            }
                            next_start = true;
                        }
                        b'\'' | b'"' if token_start => {
                            let Some(end) = close_quote(b, i + 1, c) else {
                                self.quote = Some(c);
                                return Ok(());
                            };
                            i = end;
                            self.token_start = false;
                            self.json_key = true;
                            continue;
                        }
                        b' ' | b'\t' => {
                            if b.get(i + 1) == Some(&b'#') {
                                self.token_start = true;
                                self.json_key = false;
                                return Ok(());
                            }
                            // A token may start after a space that follows one.
                            next_start = token_start || json_key;
                            next_key = json_key;
                        }
                        b'#' if i == 0 => {
                            self.token_start = true;
                            self.json_key = false;
                            return Ok(());
                        }
                        _ => {}
                    }
                    self.token_start = next_start;
                    self.json_key = next_key;
                    i += 1;
                }
            }
        }
        self.plain_continues = matches!(at, At::Plain);
        Ok(())
    }

    /// A `: ` after the node being scanned: it was a key, whose level opens at its column.
    fn key(&mut self) -> Result<(), TooDeep> {
        if let Some(col) = self.node_col.take() {
            self.enter(col, Kind::Map)?;
        }
        Ok(())
    }

    /// A block scalar starts; `header` is the rest of its line (indicators, a comment).
    fn start_block_scalar(&mut self, header: &[u8]) {
        // As libyaml: content is indented more than the enclosing level (at least 1), or
        // exactly the explicit indentation indicator past it.
        let parent = self.parent();
        let explicit = header
            .iter()
            .take_while(|c| !is_blank(Some(c)))
            .find(|c| c.is_ascii_digit() && **c != b'0')
            .map(|d| usize::from(d - b'0') + parent.unwrap_or(0));
        self.block_scalar = Some(BlockScalar {
            min: parent.map_or(1, |p| p + 1),
            indent: explicit,
        });
    }
}

/// The index just after the quote closing a scalar quoted with `q` that starts at `from`
/// (`''` is an escaped `'`, `\` escapes in `"`); `None` if it goes on past this line.
fn close_quote(b: &[u8], from: usize, q: u8) -> Option<usize> {
    let mut i = from;
    while i < b.len() {
        match b[i] {
            b'\\' if q == b'"' => i += 2,
            c if c == q => {
                if q == b'\'' && b.get(i + 1) == Some(&b'\'') {
                    i += 2;
                } else {
                    return Some(i + 1);
                }
            }
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        (0..200)
            .find(|&limit| check(text, limit).is_ok())
            .expect("under 200 levels")
    }

    #[test]
    fn counts_flow_and_block_levels() {
        assert_eq!(depth(""), 0);
        assert_eq!(depth("a: b\n"), 1);
        assert_eq!(depth("a:\n  b:\n    c: d\n"), 3);
        assert_eq!(depth("[[[]]]"), 3);
        assert_eq!(depth("a: {b: [c, {d: e}]}\n"), 4);
        assert_eq!(depth("- - - a\n"), 3);
        // A sequence at its key's column is a level of its own.
        assert_eq!(depth("a:\n- b:\n  - c:\n    - d\n"), 6);
        // Siblings do not add up.
        assert_eq!(depth("a: [1]\nb: [2]\nc: [3]\n"), 2);
        assert_eq!(depth("- a\n- b\n- [c]\n"), 2);
        assert_eq!(depth("- a: 1\n  b:\n    c: 2\n- d\n"), 3);
        // A flow collection as a key.
        assert_eq!(depth("[a]: {b: c}\n"), 2);
        // A key in a flow sequence makes its entry a single-pair mapping: a level.
        assert_eq!(depth("[true: ]"), 2);
        assert_eq!(depth("[a: [b], c, d: {e: f}]"), 3);
        assert_eq!(depth("[a, b]"), 1);
    }

    #[test]
    fn quotes_comments_and_block_scalars_are_not_nesting() {
        let text = "\
a: '[[[['
b: \"{{{{ \\\" [[[\"
c: it's [not [flow
d: x # [[[[[
e: |
  [[[[[[[[
  {{{{{{{{
f: >-
    [[[[
g: 'multi
  line [[[[
  still quoted'
h: [\"]]]\", '[[[', \"a\":\"[[\"]
";
        // `h`'s sequence holds a single-pair mapping (`"a":"[["`): three levels.
        assert_eq!(depth(text), 3);
        // JSON strings hold anything.
        assert_eq!(depth(r#"{"a":"[[[[","b":["{{{{"]}"#), 2);
    }

    #[test]
    fn documents_start_afresh_and_errors_name_document_and_line() {
        let deep = "[".repeat(150);
        let text = format!("a: [1]\n---\nb: c\n---\nx:\n  {deep}\n");
        let err = check(&text, MAX_DEPTH).unwrap_err();
        assert_eq!(
            err,
            TooDeep {
                document: 2,
                line: 6,
                limit: MAX_DEPTH
            }
        );
        assert!(err.to_string().contains("line 6"), "{err}");
        assert_eq!(depth("--- [[a]]\n--- [b]\n"), 2);
    }

    #[test]
    fn hostile_nesting_is_refused_in_linear_time() {
        for text in [
            "[".repeat(100_000),
            "{a: ".repeat(100_000),
            "- ".repeat(100_000),
            format!("a: &x !t {}", "[".repeat(100_000)),
            (0..150)
                .map(|i| format!("{}a:", " ".repeat(i)))
                .collect::<Vec<_>>()
                .join("\r"),
        ] {
            let started = std::time::Instant::now();
            let result = check(&text, MAX_DEPTH);
            assert!(result.is_err(), "{:?}", &text[..20]);
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
        }
        let long = "[".repeat(50) + &"]".repeat(50);
        assert!(check(&long.repeat(10_000), MAX_DEPTH).is_ok());
    }
}
