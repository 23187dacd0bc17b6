//! Jinja2's `joiner` and `cycler` globals, which minijinja lacks, and its
//! `lipsum`, which prints random text and so is refused.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use minijinja::value::{from_args, Object, ObjectRepr, Rest};
use minijinja::{Error, ErrorKind, State, Value};

/// `joiner(sep=", ")`: a callable giving `""` the first time, `sep` after.
#[derive(Debug)]
struct Joiner {
    sep: Value,
    used: AtomicBool,
}

impl Object for Joiner {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn call(self: &Arc<Self>, _state: &mut State<'_, '_>, args: &[Value]) -> Result<Value, Error> {
        let () = from_args(args)?;
        if self.used.swap(true, Ordering::Relaxed) {
            Ok(self.sep.clone())
        } else {
            Ok(Value::from(""))
        }
    }
}

/// The `joiner` global.
pub(crate) fn joiner(sep: Option<Value>) -> Value {
    Value::from_object(Joiner {
        sep: sep.unwrap_or_else(|| Value::from(", ")),
        used: AtomicBool::new(false),
    })
}

/// `cycler(*items)`: `.next()` gives the items in turn, `.current` the one
/// `next()` gives next, `.reset()` starts over.
#[derive(Debug)]
struct Cycler {
    items: Vec<Value>,
    pos: AtomicUsize,
}

impl Object for Cycler {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "current" => self.items.get(self.pos.load(Ordering::Relaxed)).cloned(),
            "items" => Some(Value::from(self.items.clone())),
            _ => None,
        }
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        let () = from_args(args)?;
        match method {
            "next" => {
                let pos = self.pos.load(Ordering::Relaxed);
                let item = self.items.get(pos).cloned().unwrap_or_default();
                self.pos
                    .store((pos + 1) % self.items.len().max(1), Ordering::Relaxed);
                Ok(item)
            }
            "reset" => {
                self.pos.store(0, Ordering::Relaxed);
                Ok(Value::from(()))
            }
            _ => Err(Error::from(ErrorKind::UnknownMethod)),
        }
    }
}

/// The `cycler` global.
pub(crate) fn cycler(items: Rest<Value>) -> Result<Value, Error> {
    if items.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "RuntimeError: at least one item has to be provided",
        ));
    }
    Ok(Value::from_object(Cycler {
        items: items.0,
        pos: AtomicUsize::new(0),
    }))
}

/// The `lipsum` global: defined, as in Jinja2, but refused when called
/// (its text is random).
pub(crate) fn lipsum(_args: Rest<Value>) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        "lipsum() writes random text, which prep cannot reproduce",
    ))
}
