//! A Python pickle reader for plain data (protocols 0–5): `None`, booleans, integers, floats,
//! strings, bytes, lists, tuples, sets and dicts — what a PyTorch Flight Recorder dump holds.
//! Class references and object construction (`GLOBAL`, `REDUCE`, …) are kept as opaque values;
//! nothing is ever executed.
//!
//! A damaged file keeps what it had: when the stream ends early or holds an opcode this reader
//! does not know, [`parse`] folds the unfinished containers on its stack into the outermost one
//! (a dict's complete key-value pairs, a list's complete items) and says what went wrong.

use std::collections::BTreeMap;

/// A pickled value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer too wide for 64 bits (its little-endian two's-complement bytes).
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    Set(Vec<Value>),
    /// Keys in insertion order.
    Dict(Vec<(Value, Value)>),
    /// A class reference or constructed object, by its qualified name.
    Object(String),
}

impl Value {
    /// The entry of a dict under a string key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(kv) => kv
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }

    /// Items of a list, tuple or set.
    pub fn items(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) | Value::Set(v) => Some(v),
            _ => None,
        }
    }

    /// A dict's pairs.
    pub fn pairs(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(kv) => Some(kv),
            _ => None,
        }
    }
}

/// What [`parse`] read.
#[derive(Debug)]
pub struct Parsed {
    /// The value (for a damaged stream: what of it could be assembled).
    pub value: Value,
    /// Why the stream could not be read to its end, if it could not.
    pub damage: Option<String>,
}

/// Anything on the machine's stack.
enum Slot {
    Mark,
    V(Value),
}

struct Machine<'a> {
    b: &'a [u8],
    pos: usize,
    stack: Vec<Slot>,
    memo: BTreeMap<u64, Value>,
}

/// The deepest nesting accepted (a crafted file cannot exhaust memory through the memo alone,
/// but deep stacks of marks are refused early).
const MAX_STACK: usize = 1 << 20;

/// Reads a pickle. Fails only when nothing at all could be read.
pub fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut m = Machine {
        b: bytes,
        pos: 0,
        stack: Vec::new(),
        memo: BTreeMap::new(),
    };
    match m.run() {
        Ok(v) => Ok(Parsed {
            value: v,
            damage: None,
        }),
        Err(e) => {
            let at = m.pos;
            match m.salvage() {
                Some(value) => Ok(Parsed {
                    value,
                    damage: Some(format!("{e} at byte {at}; kept what was read before it")),
                }),
                None => Err(format!("{e} at byte {at}")),
            }
        }
    }
}

impl Machine<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| "the pickle ends early".to_owned())?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self) -> Result<u32, String> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    fn len(&mut self, n: u64) -> Result<usize, String> {
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.b.len() - self.pos)
            .ok_or_else(|| "the pickle ends early".to_owned())
    }

    fn line(&mut self) -> Result<String, String> {
        let rest = &self.b[self.pos..];
        let n = rest
            .iter()
            .position(|c| *c == b'\n')
            .ok_or_else(|| "the pickle ends early".to_owned())?;
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.pos += n + 1;
        Ok(s)
    }

    fn push(&mut self, v: Value) -> Result<(), String> {
        if self.stack.len() >= MAX_STACK {
            return Err("the pickle nests too deeply".into());
        }
        self.stack.push(Slot::V(v));
        Ok(())
    }

    fn pop(&mut self) -> Result<Value, String> {
        match self.stack.pop() {
            Some(Slot::V(v)) => Ok(v),
            _ => Err("the pickle's stack is malformed".into()),
        }
    }

    fn top(&mut self) -> Result<&mut Value, String> {
        match self.stack.last_mut() {
            Some(Slot::V(v)) => Ok(v),
            _ => Err("the pickle's stack is malformed".into()),
        }
    }

    /// The values above the topmost mark (the mark removed).
    fn pop_mark(&mut self) -> Result<Vec<Value>, String> {
        let at = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or_else(|| "the pickle's stack has no mark".to_owned())?;
        let items = self
            .stack
            .split_off(at + 1)
            .into_iter()
            .map(|s| match s {
                Slot::V(v) => v,
                Slot::Mark => Value::None,
            })
            .collect();
        self.stack.pop();
        Ok(items)
    }

    fn str(bytes: &[u8]) -> Value {
        Value::Str(String::from_utf8_lossy(bytes).into_owned())
    }

    fn int_text(s: &str) -> Value {
        let t = s.trim().trim_end_matches('L');
        match t {
            "00" => Value::Bool(false),
            "01" => Value::Bool(true),
            _ => t.parse::<i64>().map_or(Value::None, Value::Int),
        }
    }

    fn long(bytes: &[u8]) -> Value {
        if bytes.is_empty() {
            return Value::Int(0);
        }
        if bytes.len() <= 8 {
            let neg = bytes[bytes.len() - 1] & 0x80 != 0;
            let mut a = [if neg { 0xff } else { 0 }; 8];
            a[..bytes.len()].copy_from_slice(bytes);
            Value::Int(i64::from_le_bytes(a))
        } else {
            Value::BigInt(bytes.to_vec())
        }
    }

    fn run(&mut self) -> Result<Value, String> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    // PROTO
                    self.u8()?;
                }
                0x95 => {
                    // FRAME: the length is advisory.
                    self.u64()?;
                }
                b'.' => return self.pop(),
                b'(' => self.stack.push(Slot::Mark),
                b'0' => {
                    self.stack.pop();
                }
                b'2' => {
                    let v = self.pop()?;
                    self.push(v.clone())?;
                    self.push(v)?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'J' => {
                    let v = self.u32()? as i32;
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'M' => {
                    let v = self.u16()?;
                    self.push(Value::Int(i64::from(v)))?;
                }
                0x8a => {
                    let n = usize::from(self.u8()?);
                    let v = Self::long(self.take(n)?);
                    self.push(v)?;
                }
                0x8b => {
                    let n = u64::from(self.u32()?);
                    let n = self.len(n)?;
                    let v = Self::long(self.take(n)?);
                    self.push(v)?;
                }
                b'I' | b'L' => {
                    let s = self.line()?;
                    self.push(Self::int_text(&s))?;
                }
                b'F' => {
                    let s = self.line()?;
                    self.push(s.trim().parse::<f64>().map_or(Value::None, Value::Float))?;
                }
                b'G' => {
                    let s = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(s);
                    self.push(Value::Float(f64::from_be_bytes(a)))?;
                }
                b'X' => {
                    let n = u64::from(self.u32()?);
                    let n = self.len(n)?;
                    let v = Self::str(self.take(n)?);
                    self.push(v)?;
                }
                0x8c => {
                    let n = usize::from(self.u8()?);
                    let v = Self::str(self.take(n)?);
                    self.push(v)?;
                }
                0x8d => {
                    let n = self.u64()?;
                    let n = self.len(n)?;
                    let v = Self::str(self.take(n)?);
                    self.push(v)?;
                }
                b'T' | b'B' => {
                    let n = u64::from(self.u32()?);
                    let n = self.len(n)?;
                    let s = self.take(n)?.to_vec();
                    self.push(if op == b'T' {
                        Self::str(&s)
                    } else {
                        Value::Bytes(s)
                    })?;
                }
                b'U' | b'C' => {
                    let n = usize::from(self.u8()?);
                    let s = self.take(n)?.to_vec();
                    self.push(if op == b'U' {
                        Self::str(&s)
                    } else {
                        Value::Bytes(s)
                    })?;
                }
                0x8e | 0x96 => {
                    let n = self.u64()?;
                    let n = self.len(n)?;
                    let s = self.take(n)?.to_vec();
                    self.push(Value::Bytes(s))?;
                }
                b'S' | b'V' => {
                    let s = self.line()?;
                    let s = s.trim();
                    let s = s
                        .strip_prefix(['\'', '"'])
                        .and_then(|x| x.strip_suffix(['\'', '"']))
                        .unwrap_or(s);
                    self.push(Value::Str(s.to_owned()))?;
                }
                b'}' => self.push(Value::Dict(Vec::new()))?,
                b']' => self.push(Value::List(Vec::new()))?,
                b')' => self.push(Value::Tuple(Vec::new()))?,
                0x8f => self.push(Value::Set(Vec::new()))?,
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Dict(pairs(items)))?;
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(items))?;
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Tuple(items))?;
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.push(Value::Set(items))?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push(Value::Tuple(items))?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    match self.top()? {
                        Value::Dict(d) => d.push((k, v)),
                        _ => return Err("SETITEM on something other than a dict".into()),
                    }
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    match self.top()? {
                        Value::Dict(d) => d.extend(pairs(items)),
                        _ => return Err("SETITEMS on something other than a dict".into()),
                    }
                }
                b'a' => {
                    let v = self.pop()?;
                    match self.top()? {
                        Value::List(l) => l.push(v),
                        _ => return Err("APPEND on something other than a list".into()),
                    }
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    match self.top()? {
                        Value::List(l) | Value::Set(l) => l.extend(items),
                        _ => return Err("APPENDS on something other than a list".into()),
                    }
                }
                b'p' => {
                    let n = self.line()?.trim().parse::<u64>().unwrap_or(u64::MAX);
                    let v = self.top()?.clone();
                    self.memo.insert(n, v);
                }
                b'q' => {
                    let n = u64::from(self.u8()?);
                    let v = self.top()?.clone();
                    self.memo.insert(n, v);
                }
                b'r' => {
                    let n = u64::from(self.u32()?);
                    let v = self.top()?.clone();
                    self.memo.insert(n, v);
                }
                0x94 => {
                    let n = self.memo.len() as u64;
                    let v = self.top()?.clone();
                    self.memo.insert(n, v);
                }
                b'g' | b'h' | b'j' => {
                    let n = match op {
                        b'g' => self.line()?.trim().parse::<u64>().unwrap_or(u64::MAX),
                        b'h' => u64::from(self.u8()?),
                        _ => u64::from(self.u32()?),
                    };
                    let v = self
                        .memo
                        .get(&n)
                        .cloned()
                        .ok_or_else(|| format!("memo entry {n} is used before it is set"))?;
                    self.push(v)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.push(Value::Object(format!("{module}.{name}")))?;
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    self.push(Value::Object(format!(
                        "{}.{}",
                        module.as_str().unwrap_or("?"),
                        name.as_str().unwrap_or("?")
                    )))?;
                }
                b'R' | 0x81 => {
                    // REDUCE / NEWOBJ: callable and arguments become an opaque object.
                    self.pop()?;
                    let f = self.pop()?;
                    self.push(opaque(f))?;
                }
                0x92 => {
                    // NEWOBJ_EX
                    self.pop()?;
                    self.pop()?;
                    let f = self.pop()?;
                    self.push(opaque(f))?;
                }
                b'b' => {
                    // BUILD: the state is dropped.
                    self.pop()?;
                }
                b'i' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.pop_mark()?;
                    self.push(Value::Object(format!("{module}.{name}")))?;
                }
                b'o' => {
                    let mut items = self.pop_mark()?;
                    let f = if items.is_empty() {
                        Value::None
                    } else {
                        items.remove(0)
                    };
                    self.push(opaque(f))?;
                }
                0x97 => {} // NEXT_BUFFER / READONLY_BUFFER: out-of-band data is not supported
                0x98 => {}
                other => return Err(format!("unknown pickle opcode {other:#04x}")),
            }
        }
    }

    /// Folds the unfinished containers into the outermost value.
    fn salvage(&mut self) -> Option<Value> {
        while let Some(at) = self.stack.iter().rposition(|s| matches!(s, Slot::Mark)) {
            let items: Vec<Value> = self
                .stack
                .split_off(at + 1)
                .into_iter()
                .filter_map(|s| match s {
                    Slot::V(v) => Some(v),
                    Slot::Mark => None,
                })
                .collect();
            self.stack.pop();
            match self.stack.last_mut() {
                Some(Slot::V(Value::Dict(d))) => d.extend(pairs(items)),
                Some(Slot::V(Value::List(l) | Value::Set(l))) => l.extend(items),
                // A mark for a tuple or a protocol-0 list: its items stand as one.
                _ => self.stack.push(Slot::V(Value::List(items))),
            }
        }
        // Whatever is left: a container and pending key/value pairs, or items, above it.
        let mut values: Vec<Value> = self
            .stack
            .drain(..)
            .filter_map(|s| match s {
                Slot::V(v) => Some(v),
                Slot::Mark => None,
            })
            .collect();
        if values.is_empty() {
            return None;
        }
        let mut root = values.remove(0);
        match &mut root {
            Value::Dict(d) => d.extend(pairs(values)),
            Value::List(l) => l.extend(values),
            _ => {}
        }
        Some(root)
    }
}

fn opaque(f: Value) -> Value {
    match f {
        Value::Object(name) => Value::Object(name),
        _ => Value::Object("?".into()),
    }
}

/// Consecutive items as key-value pairs (an odd one left at the end is dropped).
fn pairs(items: Vec<Value>) -> Vec<(Value, Value)> {
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pickle.dumps({"a": [1, -2, 300, 70000, 2**40], "b": ("x", None, True, 1.5)}, protocol=2)`
    const DICT_P2: &[u8] = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffM,\x01J\x70\x11\x01\x00\x8a\x06\x00\x00\x00\x00\x00\x01eX\x01\x00\x00\x00bq\x03(X\x01\x00\x00\x00xq\x04N\x88G?\xf8\x00\x00\x00\x00\x00\x00tq\x05u.";

    #[test]
    fn reads_a_protocol_2_dict() {
        let p = parse(DICT_P2).expect("parses");
        assert_eq!(p.damage, None);
        let a = p.value.get("a").and_then(Value::items).expect("a");
        assert_eq!(
            a,
            &[
                Value::Int(1),
                Value::Int(-2),
                Value::Int(300),
                Value::Int(70000),
                Value::Int(1 << 40)
            ]
        );
        let b = p.value.get("b").expect("b");
        assert_eq!(
            b,
            &Value::Tuple(vec![
                Value::Str("x".into()),
                Value::None,
                Value::Bool(true),
                Value::Float(1.5)
            ])
        );
    }

    #[test]
    fn a_truncated_pickle_keeps_what_came_before() {
        // Cut inside the tuple of "b": "a" is whole and kept.
        for cut in 60..DICT_P2.len() - 1 {
            let p = parse(&DICT_P2[..cut]).expect("salvaged");
            assert!(p.damage.is_some(), "cut at {cut}");
            assert_eq!(
                p.value.get("a").and_then(Value::items).map(<[Value]>::len),
                Some(5),
                "cut at {cut}: {:?}",
                p.value
            );
        }
    }

    #[test]
    fn garbage_is_an_error_or_damage_never_a_panic() {
        assert!(parse(b"").is_err());
        assert!(parse(b"\xff\xfe").is_err());
        let mut bytes = DICT_P2.to_vec();
        for i in 0..bytes.len() {
            let keep = bytes[i];
            bytes[i] = keep ^ 0x5a;
            let _ = parse(&bytes);
            bytes[i] = keep;
        }
    }
}
