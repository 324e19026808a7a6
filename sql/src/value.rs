//! What a statement binds ([`Arg`], borrowed) and what a row holds ([`Value`], owned).

/// A value bound to a statement, borrowed so that binding copies nothing.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Text(&'a str),
    Bytes(&'a [u8]),
}

/// An owned column value (keyset cursors carry them from one statement to the next).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

impl Value {
    pub fn arg(&self) -> Arg<'_> {
        match self {
            Value::Null => Arg::Null,
            Value::Int(v) => Arg::Int(*v),
            Value::Text(s) => Arg::Text(s),
            Value::Bytes(b) => Arg::Bytes(b),
        }
    }
}

/// What can be bound: strings, integers, bytes, options of them, and references to them.
pub trait ToArg {
    fn to_arg(&self) -> Arg<'_>;
}
impl ToArg for str {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}
impl ToArg for String {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}
impl ToArg for i64 {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(*self)
    }
}
impl ToArg for Vec<u8> {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Bytes(self)
    }
}
impl ToArg for [u8] {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Bytes(self)
    }
}
impl<const N: usize> ToArg for [u8; N] {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Bytes(self)
    }
}
impl<T: ToArg> ToArg for Option<T> {
    fn to_arg(&self) -> Arg<'_> {
        self.as_ref().map_or(Arg::Null, ToArg::to_arg)
    }
}
impl<T: ToArg + ?Sized> ToArg for &T {
    fn to_arg(&self) -> Arg<'_> {
        (**self).to_arg()
    }
}
