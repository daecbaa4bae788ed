//! A streaming parser of Redis requests (RESP arrays of bulk strings, and
//! inline commands) and helpers to write RESP replies.
//!
//! Built for a server that must survive a full heap: the parser holds a
//! fixed arena (allocated once) for small arguments, puts large ones in
//! separately, fallibly allocated vectors, and when an allocation fails it
//! still consumes the rest of the command and reports [`Event::OutOfMemory`]
//! instead of panicking. Input arrives in arbitrary pieces
//! ([`Parser::feed`]); nothing is buffered beyond the current command.

use alloc::vec::Vec;

/// Most arguments a command may have.
pub const MAX_ARGS: usize = 1024;
/// Largest bulk string accepted (Redis' own limit is 512 MiB).
pub const MAX_BULK: usize = 64 * 1024 * 1024;
/// Longest header or inline line.
pub const MAX_LINE: usize = 4096;

/// What [`Parser::feed`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A whole command; read it with [`Parser::argc`] / [`Parser::arg`].
    Command,
    /// A whole command whose arguments did not fit in the heap (dropped).
    OutOfMemory,
    /// Malformed input; the connection should be closed after replying.
    Protocol(&'static str),
}

enum Arg {
    Arena { start: usize, len: usize },
    Heap(Vec<u8>),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the first line of a command (`*N` or inline).
    Top,
    /// Reading a `$len` line; `left` arguments to go, this one included.
    BulkLen {
        left: usize,
    },
    /// Reading `need` payload bytes, then `\r\n`.
    Bulk {
        left: usize,
        need: usize,
        discard: bool,
    },
    BulkEnd {
        left: usize,
        crlf_seen: usize,
    },
}

pub struct Parser {
    line: Vec<u8>,
    arena: Vec<u8>,
    args: Vec<Arg>,
    state: State,
    oom: bool,
}

/// Parses a decimal integer (optional leading '-').
pub fn parse_int(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (d - b'0') as i64;
    }
    Some(if neg { -v } else { v })
}

impl Parser {
    /// A parser with an arena of `arena` bytes for small arguments.
    pub fn new(arena: usize) -> Option<Self> {
        let mut line = Vec::new();
        line.try_reserve_exact(MAX_LINE).ok()?;
        let mut arena_buf = Vec::new();
        arena_buf.try_reserve_exact(arena).ok()?;
        let mut args = Vec::new();
        args.try_reserve_exact(64).ok()?;
        Some(Parser {
            line,
            arena: arena_buf,
            args,
            state: State::Top,
            oom: false,
        })
    }

    pub fn argc(&self) -> usize {
        self.args.len()
    }

    /// Argument `i` of the last command.
    pub fn arg(&self, i: usize) -> &[u8] {
        match self.args.get(i) {
            Some(Arg::Arena { start, len }) => &self.arena[*start..*start + *len],
            Some(Arg::Heap(v)) => v,
            None => &[],
        }
    }

    /// Argument `i` as an owned vector: moved out if it has its own
    /// allocation, else copied (fallibly). None if the heap is full.
    pub fn take_arg(&mut self, i: usize) -> Option<Vec<u8>> {
        match self.args.get_mut(i)? {
            Arg::Heap(v) => Some(core::mem::take(v)),
            Arg::Arena { start, len } => {
                let (start, len) = (*start, *len);
                let mut v = Vec::new();
                v.try_reserve_exact(len).ok()?;
                v.extend_from_slice(&self.arena[start..start + len]);
                Some(v)
            }
        }
    }

    fn reset_command(&mut self) {
        self.args.clear();
        self.arena.clear();
        self.oom = false;
        self.state = State::Top;
    }

    fn push_arg_bytes(&mut self, bytes: &[u8]) {
        if self.oom {
            return;
        }
        if self.args.try_reserve(1).is_err() {
            self.oom = true;
            return;
        }
        if self.arena.capacity() - self.arena.len() >= bytes.len() {
            let start = self.arena.len();
            self.arena.extend_from_slice(bytes);
            self.args.push(Arg::Arena {
                start,
                len: bytes.len(),
            });
        } else {
            let mut v = Vec::new();
            if v.try_reserve_exact(bytes.len()).is_err() {
                self.oom = true;
                return;
            }
            v.extend_from_slice(bytes);
            self.args.push(Arg::Heap(v));
        }
    }

    /// Starts a bulk argument of `len` bytes; false if it cannot be held.
    fn begin_bulk(&mut self, len: usize) -> bool {
        if self.oom || self.args.try_reserve(1).is_err() {
            return false;
        }
        if self.arena.capacity() - self.arena.len() >= len {
            self.args.push(Arg::Arena {
                start: self.arena.len(),
                len: 0,
            });
            return true;
        }
        let mut v = Vec::new();
        if v.try_reserve_exact(len).is_err() {
            return false;
        }
        self.args.push(Arg::Heap(v));
        true
    }

    fn append_bulk(&mut self, data: &[u8]) {
        match self.args.last_mut() {
            Some(Arg::Arena { len, .. }) => {
                *len += data.len();
                self.arena.extend_from_slice(data);
            }
            // Capacity was reserved in `begin_bulk`; this never reallocates.
            Some(Arg::Heap(v)) => v.extend_from_slice(data),
            None => {}
        }
    }

    /// Collects a line into `self.line`; returns (consumed, complete).
    fn take_line(&mut self, input: &[u8]) -> Result<(usize, bool), &'static str> {
        match input.iter().position(|&b| b == b'\n') {
            Some(p) => {
                if self.line.len() + p > MAX_LINE {
                    return Err("line too long");
                }
                self.line.extend_from_slice(&input[..p]);
                if self.line.last() == Some(&b'\r') {
                    self.line.pop();
                }
                Ok((p + 1, true))
            }
            None => {
                if self.line.len() + input.len() > MAX_LINE {
                    return Err("line too long");
                }
                self.line.extend_from_slice(input);
                Ok((input.len(), false))
            }
        }
    }

    fn finish(&mut self) -> Event {
        self.state = State::Top;
        if self.oom {
            self.args.clear();
            self.arena.clear();
            self.oom = false;
            Event::OutOfMemory
        } else {
            Event::Command
        }
    }

    /// Consumes bytes of `input` up to the end of the next command. Returns
    /// how many were consumed and the event, if a command ended. After an
    /// event the caller handles it, then feeds the rest.
    pub fn feed(&mut self, input: &[u8]) -> (usize, Option<Event>) {
        let mut pos = 0;
        while pos < input.len() {
            let rest = &input[pos..];
            match self.state {
                State::Top => {
                    if self.line.is_empty() && !self.args.is_empty() {
                        // The previous command's arguments are dropped only
                        // now, so the caller could read them after its event.
                        self.reset_command();
                    }
                    let (n, done) = match self.take_line(rest) {
                        Ok(r) => r,
                        Err(e) => return (pos + rest.len(), Some(self.protocol(e))),
                    };
                    pos += n;
                    if !done {
                        continue;
                    }
                    self.reset_command();
                    let line = core::mem::take(&mut self.line);
                    let ev = self.top_line(&line);
                    self.line = line;
                    self.line.clear();
                    if let Some(ev) = ev {
                        return (pos, Some(ev));
                    }
                }
                State::BulkLen { left } => {
                    let (n, done) = match self.take_line(rest) {
                        Ok(r) => r,
                        Err(e) => return (pos + rest.len(), Some(self.protocol(e))),
                    };
                    pos += n;
                    if !done {
                        continue;
                    }
                    let len = match self.line.split_first() {
                        Some((b'$', num)) => parse_int(num),
                        _ => None,
                    };
                    self.line.clear();
                    let Some(len) = len.filter(|l| (0..=MAX_BULK as i64).contains(l)) else {
                        return (
                            pos,
                            Some(self.protocol("expected '$' and a valid bulk length")),
                        );
                    };
                    let len = len as usize;
                    let discard = !self.begin_bulk(len);
                    if discard {
                        self.oom = true;
                    }
                    self.state = State::Bulk {
                        left,
                        need: len,
                        discard,
                    };
                }
                State::Bulk {
                    left,
                    need,
                    discard,
                } => {
                    let n = need.min(rest.len());
                    if !discard {
                        self.append_bulk(&rest[..n]);
                    }
                    pos += n;
                    self.state = if n == need {
                        State::BulkEnd { left, crlf_seen: 0 }
                    } else {
                        State::Bulk {
                            left,
                            need: need - n,
                            discard,
                        }
                    };
                }
                State::BulkEnd { left, crlf_seen } => {
                    let want = b"\r\n"[crlf_seen];
                    if rest[0] != want {
                        return (pos, Some(self.protocol("bulk string not followed by CRLF")));
                    }
                    pos += 1;
                    if crlf_seen == 0 {
                        self.state = State::BulkEnd { left, crlf_seen: 1 };
                    } else if left > 1 {
                        self.state = State::BulkLen { left: left - 1 };
                    } else {
                        return (pos, Some(self.finish()));
                    }
                }
            }
        }
        (pos, None)
    }

    fn protocol(&mut self, what: &'static str) -> Event {
        self.line.clear();
        self.args.clear();
        self.arena.clear();
        self.oom = false;
        self.state = State::Top;
        Event::Protocol(what)
    }

    fn top_line(&mut self, line: &[u8]) -> Option<Event> {
        if let Some((b'*', num)) = line.split_first() {
            return match parse_int(num) {
                Some(n) if n <= 0 => None, // empty array: nothing to do
                Some(n) if n as usize <= MAX_ARGS => {
                    if self.args.try_reserve(n as usize).is_err() {
                        self.oom = true;
                    }
                    self.state = State::BulkLen { left: n as usize };
                    None
                }
                _ => Some(self.protocol("invalid multibulk length")),
            };
        }
        // An inline command: arguments separated by spaces.
        let mut any = false;
        for word in line
            .split(|&b| b == b' ' || b == b'\t')
            .filter(|w| !w.is_empty())
        {
            if self.args.len() >= MAX_ARGS {
                return Some(self.protocol("too many arguments"));
            }
            self.push_arg_bytes(word);
            any = true;
        }
        if any {
            Some(self.finish())
        } else {
            None
        }
    }
}

/// Appends RESP replies to a caller-owned buffer without growing it: each
/// returns false when the buffer lacks room (the caller flushes and retries).
pub struct Reply<'a> {
    pub buf: &'a mut Vec<u8>,
}

impl Reply<'_> {
    fn put(&mut self, parts: &[&[u8]]) -> bool {
        let need: usize = parts.iter().map(|p| p.len()).sum();
        if self.buf.capacity() - self.buf.len() < need {
            return false;
        }
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        true
    }

    pub fn simple(&mut self, s: &str) -> bool {
        self.put(&[b"+", s.as_bytes(), b"\r\n"])
    }

    pub fn error(&mut self, s: &str) -> bool {
        self.put(&[b"-", s.as_bytes(), b"\r\n"])
    }

    pub fn int(&mut self, v: i64) -> bool {
        let mut tmp = [0u8; 24];
        let s = fmt_int(v, &mut tmp);
        self.put(&[b":", s, b"\r\n"])
    }

    pub fn nil(&mut self) -> bool {
        self.put(&[b"$-1\r\n"])
    }

    pub fn array_header(&mut self, n: usize) -> bool {
        let mut tmp = [0u8; 24];
        let s = fmt_int(n as i64, &mut tmp);
        self.put(&[b"*", s, b"\r\n"])
    }

    /// A bulk string header; the caller sends the payload and `\r\n` itself
    /// when it is too large for the buffer.
    pub fn bulk_header(&mut self, len: usize) -> bool {
        let mut tmp = [0u8; 24];
        let s = fmt_int(len as i64, &mut tmp);
        self.put(&[b"$", s, b"\r\n"])
    }

    pub fn bulk(&mut self, data: &[u8]) -> bool {
        let mut tmp = [0u8; 24];
        let s = fmt_int(data.len() as i64, &mut tmp);
        self.put(&[b"$", s, b"\r\n", data, b"\r\n"])
    }
}

/// Formats `v` in decimal into `tmp`; returns the digits.
pub fn fmt_int(v: i64, tmp: &mut [u8; 24]) -> &[u8] {
    let mut i = tmp.len();
    let neg = v < 0;
    let mut u = v.unsigned_abs();
    loop {
        i -= 1;
        tmp[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if neg {
        i -= 1;
        tmp[i] = b'-';
    }
    &tmp[i..]
}

#[cfg(test)]
mod tests {
    use alloc::vec;

    use super::*;

    fn all_commands(p: &mut Parser, input: &[u8], chunk: usize) -> Vec<Vec<Vec<u8>>> {
        let mut out = vec![];
        for piece in input.chunks(chunk) {
            let mut rest = piece;
            while !rest.is_empty() {
                let (n, ev) = p.feed(rest);
                rest = &rest[n..];
                match ev {
                    Some(Event::Command) => {
                        out.push((0..p.argc()).map(|i| p.arg(i).to_vec()).collect())
                    }
                    Some(e) => panic!("{e:?}"),
                    None => {}
                }
            }
        }
        out
    }

    #[test]
    fn parses_arrays_and_inline_in_any_pieces() {
        let big = vec![b'x'; 10_000];
        let mut input = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10000\r\n".to_vec();
        input.extend_from_slice(&big);
        input.extend_from_slice(b"\r\nPING\r\n*1\r\n$4\r\nPING\r\n*0\r\n");
        for chunk in [1, 3, 7, 4096, 1 << 20] {
            let mut p = Parser::new(64).unwrap();
            let cmds = all_commands(&mut p, &input, chunk);
            assert_eq!(cmds.len(), 3, "chunk {chunk}");
            assert_eq!(cmds[0][0], b"SET");
            assert_eq!(cmds[0][2], big);
            assert_eq!(cmds[1], vec![b"PING".to_vec()]);
            assert_eq!(cmds[2], vec![b"PING".to_vec()]);
        }
    }

    #[test]
    fn take_arg_moves_large_values() {
        let mut p = Parser::new(16).unwrap();
        let (_, ev) = p.feed(b"*2\r\n$1\r\na\r\n$20\r\n01234567890123456789\r\n");
        assert_eq!(ev, Some(Event::Command));
        assert_eq!(p.take_arg(1).unwrap(), b"01234567890123456789");
        assert_eq!(p.take_arg(0).unwrap(), b"a");
    }

    #[test]
    fn bad_input_is_a_protocol_error() {
        for bad in [
            &b"*x\r\n"[..],
            b"*1\r\n:3\r\n",
            b"*1\r\n$3\r\nabcd\r\n",
            b"*1\r\n$-5\r\n",
        ] {
            let mut p = Parser::new(16).unwrap();
            let (_, ev) = p.feed(bad);
            assert!(matches!(ev, Some(Event::Protocol(_))), "{bad:?}: {ev:?}");
        }
        let mut p = Parser::new(16).unwrap();
        let (_, ev) = p.feed(&[b'a'; MAX_LINE + 10]);
        assert!(matches!(ev, Some(Event::Protocol(_))));
    }

    #[test]
    fn replies_refuse_to_grow_the_buffer() {
        let mut buf = Vec::with_capacity(16);
        let cap = buf.capacity();
        let mut r = Reply { buf: &mut buf };
        assert!(r.simple("OK"));
        assert!(!r.bulk(b"too long for it"));
        assert!(r.int(-5));
        assert_eq!(buf, b"+OK\r\n:-5\r\n");
        assert_eq!(buf.capacity(), cap);
        let mut tmp = [0u8; 24];
        assert_eq!(fmt_int(i64::MIN + 1, &mut tmp), b"-9223372036854775807");
    }
}
