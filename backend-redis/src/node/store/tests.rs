//! What a script the server does not know costs, on a fake server that counts round trips.

use std::collections::HashSet;

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value};

use super::{eval_on, pipeline_on};
use crate::node::scripts::{Call, EXTEND, RELEASE};

/// A server that knows only the scripts loaded on it since it started, answers every known
/// script call with 1, and counts requests (one per single command or pipeline sent).
#[derive(Default)]
struct Fake {
    loaded: HashSet<Vec<u8>>,
    round_trips: usize,
    loads: usize,
    /// `SCRIPT LOAD` is refused (an ACL without it).
    refuse_loads: bool,
}

fn error(line: &[u8]) -> Value {
    redis::parse_redis_value(line).expect("an error reply")
}

impl Fake {
    fn answer(&mut self, cmd: &Cmd) -> Value {
        let args: Vec<&[u8]> = (cmd.args_iter())
            .filter_map(|a| match a {
                Arg::Simple(bytes) => Some(bytes),
                _ => None,
            })
            .collect();
        match args[0] {
            b"SCRIPT" if self.refuse_loads => {
                error(b"-NOPERM no permission to run 'script|load'\r\n")
            }
            b"SCRIPT" => {
                self.loads += 1;
                let code = std::str::from_utf8(args[2]).expect("utf-8 source");
                let sha = redis::Script::new(code).get_hash().to_owned().into_bytes();
                self.loaded.insert(sha.clone());
                Value::BulkString(sha)
            }
            b"EVALSHA" if self.loaded.contains(args[1]) => Value::Int(1),
            b"EVALSHA" => error(b"-NOSCRIPT No matching script.\r\n"),
            other => panic!("unexpected {}", String::from_utf8_lossy(other)),
        }
    }
}

impl ConnectionLike for Fake {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.round_trips += 1;
        let answer = self.answer(cmd);
        Box::pin(async move { Ok(answer) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.round_trips += 1;
        let answers: Vec<Value> = pipeline.cmd_iter().map(|c| self.answer(c)).collect();
        Box::pin(async move { Ok(answers.into_iter().skip(offset).take(count).collect()) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

fn release() -> Call {
    Call::on(&RELEASE, &["{p:n}:lock"]).arg("owner")
}

#[tokio::test]
async fn a_script_the_server_lost_costs_one_round_trip_more() {
    let mut server = Fake::default();
    let answer = eval_on(&mut server, &release()).await;
    assert_eq!(answer.expect("ran"), Value::Int(1));
    assert_eq!((server.round_trips, server.loads), (2, 1));
    // Loaded now: the next call is one round trip.
    eval_on(&mut server, &release()).await.expect("ran");
    assert_eq!((server.round_trips, server.loads), (3, 1));
}

#[tokio::test]
async fn a_batch_loads_each_lost_script_once_in_one_more_round_trip() {
    let mut server = Fake::default();
    let extend = |i: usize| Call::on(&EXTEND, &[&format!("{{p:{i}}}:lock")]).arg(i);
    let calls: Vec<Call> = (0..20)
        .map(extend)
        .chain((0..3).map(|_| release()))
        .collect();
    let refs: Vec<&Call> = calls.iter().collect();
    let answers = pipeline_on(&mut server, &refs).await;
    assert_eq!(answers.len(), 23);
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().ok() == Some(&Value::Int(1)))
    );
    assert_eq!((server.round_trips, server.loads), (2, 2));
}

#[tokio::test]
async fn a_refused_load_is_the_error_the_caller_sees() {
    let mut server = Fake {
        refuse_loads: true,
        ..Fake::default()
    };
    let e = eval_on(&mut server, &release()).await.expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::NoPerm), "{e}");
    let answers = pipeline_on(&mut server, &[&release(), &release()]).await;
    for a in answers {
        let e = a.expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::NoPerm), "{e}");
    }
}
