//! Field-level encoding: the `Wire` trait (put / get with limits), its implementations
//! for integers and containers, and `wire_struct!`, which derives a struct's codec
//! from its field list (fields in declaration order, little-endian, no padding).

use crate::{ProtoError, Result};

/// Bounds-checked little-endian reader over a body.
pub struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, at: 0 }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or(ProtoError::Truncated(what))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returned N bytes"))
    }

    pub fn remaining(&self) -> usize {
        self.b.len() - self.at
    }

    pub fn position(&self) -> usize {
        self.at
    }

    /// Every byte must have been consumed.
    pub fn end(&self) -> Result<()> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(ProtoError::Invalid("trailing bytes in body"))
        }
    }
}

/// A value with a wire encoding. `get` checks every limit the type stands for, so a
/// decoded value is always a valid one.
pub trait Wire: Sized {
    fn put(&self, out: &mut Vec<u8>);
    fn get(r: &mut Reader<'_>) -> Result<Self>;

    /// Encoded size in bytes.
    fn wire_len(&self) -> usize {
        let mut v = Vec::new();
        self.put(&mut v);
        v.len()
    }

    /// The whole encoding as a body.
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.put(&mut v);
        v
    }

    /// Decode a whole body: exactly one value, no trailing bytes.
    fn decode(body: &[u8]) -> Result<Self> {
        let mut r = Reader::new(body);
        let v = Self::get(&mut r)?;
        r.end()?;
        Ok(v)
    }
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(r: &mut Reader<'_>) -> Result<Self> {
                Ok(<$t>::from_le_bytes(r.array(stringify!($t))?))
            }
            fn wire_len(&self) -> usize {
                std::mem::size_of::<$t>()
            }
        }
    )*};
}
wire_int!(u8, u16, u32, u64, i32, i64);

/// One byte, 0 or 1.
impl Wire for bool {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        match u8::get(r)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::Invalid("boolean other than 0 or 1")),
        }
    }
    fn wire_len(&self) -> usize {
        1
    }
}

/// A presence byte (0 or 1), then the value if present.
impl<T: Wire> Wire for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        match u8::get(r)? {
            0 => Ok(None),
            1 => Ok(Some(T::get(r)?)),
            _ => Err(ProtoError::Invalid("presence flag other than 0 or 1")),
        }
    }
}

/// Derive `Wire` for a struct from its field list: the fields in order. An optional
/// `check(v) { ... }` block validates the decoded value as a whole (ranges that span
/// fields); it runs after every field decoded and its own limits passed.
macro_rules! wire_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)?
        }
        $( check($v:ident) { $($check:tt)* } )?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $crate::wire::Wire for $name {
            #[allow(unused_variables)]
            fn put(&self, out: &mut Vec<u8>) {
                $( $crate::wire::Wire::put(&self.$field, out); )*
            }
            #[allow(unused_variables)]
            fn get(r: &mut $crate::wire::Reader<'_>) -> $crate::Result<Self> {
                let v = $name {
                    $( $field: <$ty as $crate::wire::Wire>::get(r)?, )*
                };
                $( (|$v: &$name| -> $crate::Result<()> { $($check)* })(&v)?; )?
                Ok(v)
            }
        }
    };
}
pub(crate) use wire_struct;
