//! The SSE wire format: bytes to events ([`SseParser`]), bounded per line and per event.
//!
//! Must not know: dCache, inotify, NATS.

use super::{MAX_EVENT_BYTES, MAX_LINE_BYTES};

/// One event of the stream, dispatched at a blank line (WHATWG "server-sent events").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event` field; `message` when absent.
    pub event: String,
    /// The `data` fields joined with `\n`; `None` when the block had no `data` field (only an
    /// `id`: the resume point moved on, nothing to dispatch).
    pub data: Option<String>,
    /// The `id` field of this block, when it had one (`Some("")` resets the resume point).
    pub id: Option<String>,
}

/// What the parser yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// A complete event.
    Event(SseEvent),
    /// An event dropped because one of its lines was too long or not UTF-8, or it was too
    /// large; its `id`, when it had one (so the resume point can move past it).
    Refused {
        /// The block's `id` field.
        id: Option<String>,
        /// Why.
        reason: &'static str,
    },
}

/// An incremental `text/event-stream` parser with bounded memory: lines end in CRLF, LF or CR
/// (also split across chunks), `:` starts a comment, a field without `:` has an empty value,
/// one space after the `:` is dropped, a blank line dispatches. A line longer than `max_line`
/// is not kept: it is skipped to its end and its event is refused. An incomplete event at the
/// end of the stream is discarded (a new parser per connection).
#[derive(Debug)]
pub struct SseParser {
    pub(super) max_line: usize,
    pub(super) max_event: usize,
    /// The current line, not yet terminated.
    pub(super) line: Vec<u8>,
    /// The current line is overlong: drop bytes until its end.
    pub(super) skipping: bool,
    /// The last byte was a CR: a following LF belongs to the same line end.
    pub(super) after_cr: bool,
    /// Bytes seen so far, to strip a leading BOM once.
    pub(super) at_start: bool,
    pub(super) event: String,
    pub(super) data: String,
    pub(super) has_data: bool,
    pub(super) id: Option<String>,
    /// Bytes of field values in the current event.
    pub(super) size: usize,
    pub(super) refused: Option<&'static str>,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new(MAX_LINE_BYTES, MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser refusing lines over `max_line` bytes and events over `max_event` bytes.
    pub fn new(max_line: usize, max_event: usize) -> SseParser {
        SseParser {
            max_line,
            max_event,
            line: Vec::new(),
            skipping: false,
            after_cr: false,
            at_start: true,
            event: String::new(),
            data: String::new(),
            has_data: false,
            id: None,
            size: 0,
            refused: None,
        }
    }

    /// Feeds the next chunk of the stream; complete events are pushed to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseItem>) {
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
                Some(i) => {
                    self.push(&rest[..i]);
                    self.after_cr = rest[i] == b'\r';
                    rest = &rest[i + 1..];
                    self.end_line(out);
                }
                None => {
                    self.push(rest);
                    rest = &[];
                }
            }
        }
    }

    pub(super) fn push(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        if self.line.len() + bytes.len() > self.max_line {
            self.skipping = true;
            self.line = Vec::new();
            self.refuse("line too long");
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    pub(super) fn refuse(&mut self, reason: &'static str) {
        self.refused.get_or_insert(reason);
        self.data = String::new();
    }

    pub(super) fn end_line(&mut self, out: &mut Vec<SseItem>) {
        if self.skipping {
            self.skipping = false;
            return;
        }
        let mut line = std::mem::take(&mut self.line);
        if self.at_start {
            self.at_start = false;
            if line.starts_with(&[0xEF, 0xBB, 0xBF]) {
                line.drain(..3);
            }
        }
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let Ok(line) = String::from_utf8(line) else {
            self.refuse("line is not UTF-8");
            return;
        };
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        // A `data` line after the first adds its value and the `\n` that joins it.
        self.size += value.len() + usize::from(field == "data" && self.has_data);
        if self.size > self.max_event {
            self.refuse("event too large");
            return;
        }
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => {
                if self.refused.is_none() {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                }
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            // `retry` (the server's reconnect delay) is not used: the bridge has its own backoff.
            _ => {}
        }
    }

    pub(super) fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        let id = self.id.take();
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        let has_data = std::mem::replace(&mut self.has_data, false);
        self.size = 0;
        if let Some(reason) = self.refused.take() {
            out.push(SseItem::Refused { id, reason });
            return;
        }
        if !has_data && id.is_none() {
            return;
        }
        let event = if event.is_empty() { "message".to_owned() } else { event };
        out.push(SseItem::Event(SseEvent { event, data: has_data.then_some(data), id }));
    }
}
