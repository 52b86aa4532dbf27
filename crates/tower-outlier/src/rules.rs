//! The rules the layer follows, each stated once. Code, tests and the README refer here.
//!
//! The policies implement the behaviour of production systems: error-rate ejection as Alibaba
//! EDAS and HSF describe their "outlier instance removal", the slow-call ratio circuit breaker of
//! Alibaba Sentinel, the weight degradation of SOFARPC's fault tolerance, and the outlier
//! detectors of Envoy, gRPC and linkerd2-proxy (section 11). Where those systems are silent, the
//! rule below says what this crate decided.
//!
//! # 1. Outcomes
//!
//! Every finished call has one outcome: a success, or a failure of a kind (transport error,
//! timeout, server error, gateway failure, overload, business failure), and a latency. HTTP 503
//! is overload, 502 and 504 are gateway failures, other 5xx server errors. A call whose response
//! future is dropped before it finishes is *cancelled* and counts as neither. The classifier
//! decides which results are failures ([`classify`](crate::classify)): EDAS counts network
//! exceptions, or network exceptions and HTTP 5xx; HSF lets a predicate decide; SOFARPC counts
//! timeouts and overload only. A gRPC status may arrive in the trailers, so a classifier may
//! decide when the response body ends. Overload (503, gRPC UNAVAILABLE) is judged like any other
//! failure: behind a proxy or a mesh it is also what a dead upstream looks like (Envoy's "no
//! healthy upstream", a gRPC server going away).
//!
//! Which errors are whose: an error the caller's own stack raised before the call reached the
//! endpoint is *not sent* ([`Outcome::NotSent`](crate::classify::Outcome::NotSent)) and, like a cancelled call,
//! counts as neither success nor failure — `tower::load_shed`'s `Overloaded` (the endpoint's
//! own stack shedding while its inner service is not ready) and the layer's
//! [`NoEndpointAvailable`](crate::fail_fast::NoEndpointAvailable) (an inner tier failing fast),
//! and, with the `h2` feature (on with `tonic`), an HTTP/2 connection the client's own h2 closed
//! with a GOAWAY `ENHANCE_YOUR_CALM` (its count of locally reset streams ran out, hyperium/h2#856;
//! the same GOAWAY received from the server is the server's), found anywhere in the error's
//! causes. Envoy stopped counting its own circuit breaker's
//! overflow against hosts for the same reason: such false ejections shrink a fleet under load.
//! A not-sent call steers the balancer away from the endpoint for a moment (its estimate is
//! raised as after a fast failure, and it is tried again after losing 16 draws in a row); the
//! next success restores it. A stack that refuses every call for 2 s with no success between is
//! stuck, not busy (a connection that never comes up behind a load shedder, an inner tier with
//! nothing to pick): from then on its refusals count as the endpoint's transport failures. Every other error — refused, reset, timed out, a protocol error —
//! is the endpoint's. A classifier of your own ([`classify_fn`](crate::classify::classify_fn))
//! decides for itself.
//!
//! # 2. Error-rate ejection (EDAS, HSF)
//!
//! * An endpoint is judged only when its window (10 s by default; 15 s for Dubbo 2.7) holds at
//!   least the minimum number of calls (10 by default).
//! * It is an outlier when its error rate in the window is **strictly greater** than the
//!   threshold (50 %): 6 failures in 10 calls is ejected, 5 in 10 is not.
//! * The failing call that crosses the threshold wakes the layer, which ejects before the
//!   balancer picks its next endpoint.
//!
//! # 3. The budget and the last endpoint
//!
//! * At most `floor(n × max_ejection_ratio)` endpoints are out at once (20 % by default), `n`
//!   counting every endpoint the upstream holds, whatever the policy that ejects them. When that
//!   is below one, EDAS ejects none and HSF ejects one ([`BudgetFloor`](crate::policy::BudgetFloor)).
//!   Envoy's rule is EDAS's (`(ejected + 1) / n` within the ratio), or HSF's with
//!   `always_eject_one_host`; gRPC's rounds up (an ejection is allowed while fewer than
//!   `n × ratio` are out, so the first always is).
//! * The last available endpoint is never ejected — under the default
//!   [`WhenAllOut::KeepLast`](crate::WhenAllOut), EDAS's and HSF's rule and this library's
//!   recommendation. A layer may choose otherwise
//!   ([`when_all_out`](crate::OutlierDetectionLayer::when_all_out); each detector preset brings
//!   its system's, but linkerd's keeps the last: see below): [`FailFast`](crate::WhenAllOut::FailFast)
//!   (gRPC's; linkerd's when told) ejects the last one too, and calls then fail at once behind the layer's
//!   [`fail_fast`](crate::OutlierDetectionLayer::fail_fast) guard, or wait for an endpoint to come
//!   back without it; [`PanicBelow`](crate::WhenAllOut::PanicBelow) (Envoy's
//!   `healthy_panic_threshold`, 50 %) hands the balancer every endpoint, ejected ones included,
//!   while fewer than that share are healthy, and takes the still-ejected ones back out when
//!   enough are ([`Snapshot::all_out`](crate::Snapshot) says which holds). Why keep the last: a
//!   fleet the rules would empty is far more often failing as a whole (a bad deploy, a shared
//!   dependency) than failing everywhere at once, and whatever it still answers reaches callers;
//!   failing fast only helps a caller with a fallback of its own. linkerd itself fails fast, but
//!   its preset here keeps the last: with a fleet that flaps together (every endpoint down 5 s in
//!   10) failing fast delivered 64 % more failed calls than no detection in the detection
//!   benchmark, keeping the last exactly as many. gRPC's preset fails fast as gRPC does: its
//!   budget of 10 % already keeps the last in every scenario the benchmark runs.
//! * Only the rules' own judgement may take the last endpoint, and only under `FailFast` or
//!   `PanicBelow`. What else takes an endpoint out — its server's pushback, its health service
//!   saying it is not serving, the layer's checks of it while it gets no traffic, its host held
//!   out by another adaptor, an operator — never takes the last one the balancer can pick,
//!   whatever `WhenAllOut` says: a fleet whose servers all asked for a pause, or all said they
//!   drain, keeps one to call.
//! * A refusal is said in the log and in the monitor
//!   ([`EndpointSnapshot::refused`](crate::EndpointSnapshot), with the budget's arithmetic:
//!   "ejection budget of 1 for 5 endpoints at 20 % is spent"); a budget that allows no ejection at
//!   all for the fleet, once ([`Snapshot::no_ejection`](crate::Snapshot): "ejection budget of 0
//!   for 3 endpoints at 20 %").
//! * An ejection the rules refuse is retried when they may allow it (the set grows, an endpoint
//!   comes back). If the upstream removes endpoints so that more are out than the budget allows,
//!   or none is left in, endpoints come back on trial until the rules hold: first those being
//!   probed (their check is under way; the probe is abandoned), then those whose checks are due
//!   soonest.
//!
//! # 4. Recovery
//!
//! * **Schedule.** The policy that ejected the endpoint sets it. Error-rate ejection: the first
//!   check is one recovery unit after the ejection; each failed check makes the next one unit
//!   later, up to a maximum multiple (EDAS 30 s × 20, so every 10 min at most; HSF 60 s × 60,
//!   every hour); a passed check resets it to one unit. The slow-call breaker owns its timing:
//!   the check comes when the breaker's open duration ends (however late the budget let the
//!   ejection happen), and after a failed active probe one open duration later.
//! * **Passive trial** (the default check). The endpoint is re-admitted and judged only on the
//!   calls it gets from then on. Breaching again ejects it with the next, longer interval. A
//!   trial period is the longest of the layer's policies' trial periods (an error-rate policy's
//!   is its window, a breaker's its interval, a weight policy's its window; at least 1 ms). The
//!   trial passes only on evidence: no policy judges the endpoint an outlier, and the ejecting
//!   policy's windows, added up over the trial's periods, hold at least its minimum number of
//!   calls; otherwise the trial goes on for another period. A trial that
//!   breaches while the budget or the last-endpoint rule keeps the endpoint in is a failed
//!   check all the same (once per re-admission): it stays on trial and is ejected as soon as the
//!   rules allow.
//! * **Active probe** ([`probe`](crate::probe)). A request of your own is sent through a clone
//!   of the ejected endpoint's service; success re-admits, failure (or no answer within one
//!   recovery unit) is a failed check. No caller's request reaches the endpoint meanwhile.
//! * **Endpoints without traffic** ([`ProbeCadence::no_traffic_interval`](crate::probe::ProbeCadence::no_traffic_interval),
//!   off by default). An endpoint in service with no call completed or in flight for the
//!   interval is checked by the same probe, from a task of the layer's own (a quiet service's
//!   balancer may not be polled at all), every interval while it gets none; at the
//!   `unhealthy_threshold` of failed checks in a row (3 by default) it is taken out when the
//!   adaptor is next polled — before the balancer picks for the first call after the quiet —
//!   within the budget and never the last endpoint, and comes back by its checks like any
//!   ejected endpoint (its reason's policy is
//!   [`ACTIVE_CHECK_POLICY`](crate::events::ACTIVE_CHECK_POLICY)). A call completed clears the
//!   count; so do dry run's mode switches. Recovery checks of ejected endpoints run while the
//!   balancer is polled.
//!
//! # 5. Slow calls (Sentinel)
//!
//! * A call is slow when its latency is strictly greater than the maximum response time.
//! * Closed → open → half-open. In the closed state, after each completion, once the interval
//!   (1 s by default) holds the minimum number of requests (5), the breaker opens when the slow
//!   ratio is strictly greater than the threshold — or, with a threshold of 1.0, when every call
//!   was slow. Error ratio: errors ÷ calls strictly greater; error count: errors strictly
//!   greater.
//! * Open rejects every call for the open duration; then exactly one call is the half-open
//!   probe, and its completion alone decides: slow or failed re-opens for another full
//!   duration, otherwise the breaker closes and the statistics restart. Observers hear of every
//!   state change with the value that caused it.
//! * In this layer an open breaker ejects its endpoint within the shared budget; an open breaker
//!   whose ejection the budget refused keeps serving calls (other than its half-open probe);
//!   standalone
//!   (`slow_call::CircuitBreakerLayer`) calls fail fast with a
//!   distinct error while it is open.
//!
//! # 6. Weight degradation (SOFARPC)
//!
//! Once per window (10 s):
//! * An endpoint is counted only when its calls reach the least count (10) scaled by its current
//!   weight over its original weight (the ratio rounded half-up to hundredths, multiplied, then
//!   truncated; at least 1).
//! * The average exception rate is taken over the counted endpoints, the judged one included;
//!   with none counted nothing is judged, and with an average of 0 every counted endpoint is
//!   healthy. Rates and their quotient are rounded half-up to hundredths, as SOFARPC does.
//! * An endpoint is abnormal when its rate ÷ the average is at least the multiple (6). With
//!   degradation on, its weight becomes weight × degrade rate (0.05), never below the least
//!   weight, compounding each abnormal window, with at most a maximum number of endpoints (2)
//!   degraded at once; with it off, abnormal endpoints are only reported.
//! * A healthy degraded endpoint's weight becomes weight × recover rate (2), and once that
//!   reaches the original weight it is restored to it exactly.
//! * The weight reaches the balancer through the load: the endpoint's load is divided by its
//!   weight relative to the original.
//!
//! # 7. Load and the balancer
//!
//! * Each endpoint's [`Load`](tower::load::Load) is (latency estimate + 1 µs) × (calls in
//!   flight + 1) ÷ relative weight ([`EndpointCost`](crate::discover::EndpointCost)). The latency estimate is a
//!   peak-sensitive moving average that decays toward zero while the endpoint is idle (10 s time
//!   constant), with three rules of its own:
//!   * **The first call** after the endpoint joins or is re-admitted, if it succeeds, moves the
//!     estimate an eighth of the way to its latency, never as a peak (not at all for an endpoint
//!     never measured and not seeded): it may have set up the connection (TCP, TLS, an HTTP/2
//!     handshake, 1.5 to 43 ms against 0.1 ms warm calls on loopback). A first call that fails
//!     takes the failure rules.
//!   * **A fast failure** (any failure but a timeout: a refused connection, a reset, a 5xx, a
//!     gRPC error status) doubles the estimate, from at least 1 µs and up to 16 times what it was
//!     before the failures began (16 ms for an endpoint never measured), or takes the failure's
//!     own latency if longer; after a timeout's 1 s it comes down to that cap. Failing fast never
//!     makes an endpoint the balancer's cheapest pick. (Two calls completing at once on two cores
//!     can leave a penalty in place until the next success: the estimate is updated without a
//!     compare-and-swap, as it always was.)
//!   * **The first success** after failures restores the estimate from before them.
//! * **Evidence.** While an endpoint's last call failed fast, the one before it failed too or the
//!   endpoint has served nothing since it joined or was re-admitted (one failure of a serving
//!   endpoint may be a gray endpoint's), a policy needs more calls to judge it (the next call of a
//!   streak of consecutive failures; an error rate above the threshold on fewer calls than the
//!   minimum), and the layer could eject it (budget and last endpoint, section 3), its load is
//!   zero until that many calls are in flight: exactly the failures the policy asks for. Never after a timeout (each call would cost a caller a timeout, and the balancer
//!   already routes around the endpoint), never for a detector that judges on a timer, never when
//!   a policy lowered the endpoint's weight.
//! * **Avoided.** An endpoint whose last call failed, with none in flight and none completed for
//!   a second or more, is shown avoided ([`EndpointSnapshot::avoided_for`](crate::EndpointSnapshot)):
//!   the balancer routes around it and no policy has judged it. It gets a call again as its
//!   estimate decays, and its first success restores its share. One avoided after a timeout (a
//!   black hole, whose estimate is the timeout and takes most of a minute to decay) is checked
//!   by the layer's active probe, if it has one, 1 s after the timeout and every 2 s while it
//!   does not answer, at no caller's expense and without leaving the balancer's set; the first
//!   answer restarts its estimate at the fleet's, so it has its share back at once. At most a
//!   tenth of the endpoints (two at least) are checked at once.
//! * **Exploration.** An endpoint with no call in flight whose estimate rests on one slow call
//!   more than twice the estimate before it (a connection's handshake on the first call counts),
//!   which no later call has confirmed, wins a power-of-two-choices draw after losing 16 in a
//!   row, until its estimate is back within a quarter of where it was: p2c never picks the
//!   costliest of three endpoints, so a healthy endpoint's one noisy or slow call would otherwise
//!   shut it out for the estimate's decay time. A genuinely slow endpoint's next slow call
//!   (more than twice the estimate before the jump, and at least half the estimate now)
//!   confirms it: it gets one call more each time p2c tries it again. So do four such slow
//!   calls in a row that are under half the estimate (an endpoint that jumped far above its new,
//!   steady latency); calls of twice the usual time between fast ones (a loaded machine's) do
//!   not.
//! * **A stale estimate.** An endpoint with no call in flight whose last call succeeded a second
//!   ago or more (`STALE_ESTIMATE`), with none completed since, wins a draw after losing 64 in a
//!   row, and a success after such a gap that comes back under half the estimate replaces it:
//!   an endpoint that was slow and healed has its share back about a second after healing,
//!   instead of after its estimate decays below its peers' (p2c alone never picks the costliest
//!   endpoint). A slow endpoint pays for this with one call in 32·n at most (n endpoints), and
//!   one a second at most: at 200 requests a second over five endpoints, half a percent of the
//!   calls; over two or three endpoints at low traffic, 1.6 or 1 %. Not for an endpoint that has had
//!   no call since it joined or was re-admitted: its estimate is a seed, not a measurement, and
//!   its trial belongs to its rules. Nor in draws it sits out (slow start, weights from load
//!   reports) or while its server says it is degraded.
//! * **Following up a fast failure.** An endpoint with no call in flight whose last call failed
//!   fast a second ago or more, with none completed since, wins a draw after losing 16 in a row
//!   when a policy would judge on the next call (a streak under way) and the layer could eject
//!   it: a second failure makes the evidence rule above send it the rest of the streak, a success
//!   restores its estimate. Under serial traffic p2c may stop picking an endpoint after one fast
//!   failure (its estimate doubled), and a server killed then would be left avoided and unjudged,
//!   and once restarted unfed until its estimate decayed. Policies that judge on a tick or a
//!   window are not sent the call: it would only fail again.
//! * **Slow start** (off unless
//!   [`OutlierDetectionLayer::slow_start`](crate::OutlierDetectionLayer::slow_start) sets it).
//!   An endpoint that joins while an available endpoint has served, or is re-admitted (not in dry
//!   run, not while the fleet panics), ramps up over the window by Envoy's formula: its share of a
//!   full endpoint's traffic is `s = max(min_weight, (max(t, 1 s) / window)^(1 / aggression))`.
//!   It takes part in `s·n / (n − 1 + s)` of its power-of-two-choices draws (`n`: the available
//!   endpoints when the ramp began, itself included), evenly spread, and its load is infinite in
//!   the others; with even costs that gives it `s` of a full share. The evidence and exploration
//!   rules above come first.
//! * **Weights from load reports** (an `orca::OrcaPolicy` among the layer's policies, feature
//!   `orca`). Every update period each endpoint in the balancer's set with a weight in force
//!   (gRFC A58's, from the load reports in its calls' trailers, reported for the blackout period
//!   and not expired; the mean of those for the others) takes part in
//!   `1 − (n − 1)(max t − t_i)` of its draws, `t` being the weights' shares, and its load is
//!   infinite in the others: with even costs p2c then gives each endpoint its weight's share. With
//!   fewer than two weights in force nobody sits a draw out. With slow start, the two shares
//!   multiply.
//! * **Degraded by its server** (off unless
//!   [`OutlierDetectionLayer::detect_degraded`](crate::OutlierDetectionLayer::detect_degraded)
//!   sets a hold). A response with `x-envoy-degraded` (or a classifier's
//!   [`Recorder::degraded`](crate::classify::Recorder::degraded)) marks the endpoint degraded for
//!   the hold, a response without it ends the mark. A degraded endpoint's load is 10²⁰ more: p2c
//!   picks it only against another degraded endpoint, or when no other is ready. It is not
//!   ejected for it and its outcomes count as usual, so a policy ejects it as any other.
//!
//! * **Health watched** (a probe whose [`watch`](crate::probe::Probe::watch) streams what the
//!   endpoint's health service says, as `grpc_health::GrpcHealth` (feature `grpc-health`) does for
//!   `grpc.health.v1`): not serving takes the endpoint out at once, within the budget and never
//!   the last (section 3; kept in, its load is infinite until it serves); serving brings it back
//!   at once, without a trial. A watch that ends or panics gives up its word: the endpoint
//!   counts as serving and its calls judge it (a dead watch's "not serving" would hold it out
//!   for good). An endpoint the rules ejected is checked by the probe as usual, and one that
//!   comes back while its health service says it is not serving is taken out again. Coming back
//!   from a signal's ejection (health, pushback, a host), an endpoint keeps what its rules
//!   counted, and they judge it at once; the rules' own ejection comes before any signal's.
//!
//! # 8. Upstream changes
//!
//! * An endpoint comes back from an ejection as a clone of its service, unless
//!   [`OutlierDetectionLayer::rebuild_on_return`](crate::OutlierDetectionLayer::rebuild_on_return)
//!   is set and a call of it timed out or failed in transport since it joined or last returned:
//!   then it is made a new service from the factory, once per ejection, before its recovery probe
//!   (which runs on it) or its re-admission, whichever comes first. A factory that panics or
//!   answers `None` keeps the service.
//! * The upstream is authoritative. An endpoint it removes is forgotten at once (its state, its
//!   timers, its probe) and never re-inserted by a recovery timer.
//! * An insert for a known key replaces the service and keeps the key's history: an available
//!   endpoint is re-inserted with the new service, an ejected one stays out until it recovers.
//! * Upstream errors pass through and lose nothing. When the upstream ends, the last known set
//!   stays under detection; the stream ends once the upstream has ended holding no endpoint.
//!
//! # 9. Latency against the fleet (LinkedIn D2)
//!
//! With a `latency::LatencyPolicy` (feature `latency`): every interval (5 s) each endpoint in the
//! balancer's set is timed by a statistic of its successes' and timeouts' latencies in the
//! interval (a sketch of log-linear buckets): the p90 (`LatencyConfig::recommended`) or the mean
//! (`LatencyConfig::d2`), its calls in flight counted at how long they have waited with no call
//! completing, each as many calls as the bar's worth of time it has held. The fleet's bar is the
//! median of the endpoints' statistics (recommended) or their call-weighted mean (D2). With at
//! least `min_endpoints` (3) endpoints of at least `min_calls` (10) calls, one at or above
//! `eject_above` (1.3) times the bar `intervals` (2 recommended, 1 for D2) intervals in a row is
//! an outlier until the next interval, ejected within the budget (section 3). Back on trial
//! (section 4), one interval above `readmit_below` (1.1) times the bar fails it, until an
//! interval finds it at or below that. With `down_weight`, nothing is ejected: while it stands
//! out its relative weight is the bar over its statistic, doubling back each interval it gets
//! too few calls to judge, and 1 once it is at or below `readmit_below`.
//!
//! # 10. Policies combined
//!
//! A `ComposedPolicy` (`any_of`, `all_of`, `at_least(k)`) is one policy of the layer. Every
//! member records every call; the composition judges an endpoint an outlier when at least one,
//! every, or `k` members judge it one at that moment, with the first such member's reason. When
//! it ejects, each member that judged proposes a time out (its own timing, else its recovery
//! schedule after the episode's failed checks), and the latest wins; after a failed probe the
//! same members propose again. A member judging on a timer is evaluated on its own interval.

//! # 11. The detectors of Envoy, gRPC and linkerd
//!
//! `tower_outlier::detectors` (feature `detectors`). One endpoint state per endpoint holds
//! every detector's counts and one ejection counter that all of them grow.
//!
//! * **Consecutive failures**, judged on each call. A detector fires at **exactly** its N-th
//!   failure in a row, and its streak then starts over, so N more failures fire it again; a
//!   success ends the streak. Consecutive 5xx counts every failure; consecutive gateway failures
//!   count gateway failures (502, 504, gRPC DEADLINE_EXCEEDED) and overload (503, gRPC
//!   UNAVAILABLE, and 429 or RESOURCE_EXHAUSTED where the classifier counts them, which Envoy
//!   would not: it maps them to 429, not a 5xx), and refused connections and timeouts.
//!   With `split_external_local_origin_errors`, transport errors and timeouts (raised before any
//!   response) count only in the consecutive local-origin detector, and any response ends that
//!   streak. A firing counts as detected; its enforcement percentage decides (seeded dice)
//!   whether it asks for the ejection. A request the budget refuses stands for one interval.
//!   Calls still in flight when an endpoint is ejected complete streaks without detections. A
//!   streak of timeouts asks the balancer for the rest of its calls (rule 7; at most 8 at once);
//!   a streak of fast failures does not need to.
//! * **Success rate** and **failure percentage**, judged on every interval over the calls of the
//!   interval just ended, among the endpoints in rotation that had at least the request volume,
//!   when there are at least the minimum hosts. Success rate: below `mean − factor/1000 ×
//!   population stdev` (Envoy, gRPC), or below `median − factor/1000 × max(1.4826 × MAD,
//!   min_spread)` (the robust rule: two of five fully down are both ejected; a tight healthy
//!   fleet ejects none). Failure percentage: at or above the threshold (Envoy), above it (gRPC).
//!   With the origins split, both also run over local-origin events. An endpoint the balancer
//!   starved — in rotation for the whole interval, every call of it failed (two at least) and
//!   its last call too — takes part as if it had carried the request volume at that rate: its system's
//!   balancer (round robin) would have given it its share until the tick, and the volume would
//!   have been there; p2c routes around it on its first failures.
//! * **Ejection time.** Envoy: `min(base × m, max)` plus up to `max_ejection_time_jitter`, where
//!   the multiplier `m` grows on each ejection while `base × m < max + base` and drops by one on
//!   each interval tick from one full interval after the endpoint came back; it comes back on the
//!   first tick at or after that time. gRPC: `min(base × m, max(base, max))`, `m` growing on each
//!   ejection and dropping by one on every tick the endpoint is in rotation; it comes back on the
//!   first tick at or after that time too. An endpoint condemned at a tick is ejected before the
//!   multipliers decay (if the ejection is refused, the decay is paid at the next tick). Before
//!   the first tick, exactly at the time. linkerd: the back-off
//!   `min(base × 2ⁿ, max)` after n failed probes, lengthened by up to `jitter` of itself (never
//!   beyond max); it comes back for one real request, the probe, with every other call held
//!   (`Pending`) until the probe answers, and after a failed probe until the layer ejects it
//!   again or keeps it in. A successful probe ends the trip (the next starts at
//!   `base`); a failed one ejects it for the next back-off.
//! * All of it inside the layer's one budget. When every endpoint would be out each preset does
//!   what its system does (section 3): Envoy's panics below 50 % healthy, gRPC's and linkerd's
//!   fail fast; the recommended configuration keeps the last.
//!
//! # 12. Rules that change while the layer runs
//!
//! A [`RulesHandle`](crate::RulesHandle) replaces a policy of the layer by one of the same kind,
//! typed or read from a document ([`dialect`](crate::dialect)). An invalid document, or a policy
//! of another kind, is refused with its error (logged, and in the monitor's `rules_error`); the
//! rules in force stay. An accepted one is published at once under the next version and applied
//! by each adaptor on its own task the next time the balancer polls it (behind `Buffer`: the next
//! request), without pausing traffic. Setting by setting:
//!
//! * **A document replaces the policy's whole configuration**: a setting it leaves out takes its
//!   dialect's default (HSF's, Sentinel's, SOFARPC's, Envoy's, gRPC's), not the value in force.
//! * **Every endpoint** moves to a new record made from its old one: its latency estimate, weight
//!   and last outcome, and what each policy keeps below. Endpoints in the balancer's set are
//!   re-inserted with it; calls in flight at the change finish on the old record and are not
//!   counted. Then every endpoint in the set is judged by the new rules: one that a lower
//!   threshold now condemns is ejected at once, on the calls its window already holds.
//! * **Ejected endpoints** stay out until the check scheduled at their ejection, whatever the
//!   new rules; the new recovery schedule, trial period and probe timing apply from their next
//!   check. Trials under way end when they were to.
//! * **A policy turned off** (HSF `qosEnabled: false`) re-admits, on trial, the endpoints it had
//!   ejected.
//! * **The budget** (when the layer was not given one) follows the new rules at once: a smaller
//!   one re-admits on trial the ejected endpoints due soonest until it holds; a larger one lets
//!   refused ejections through.
//! * **Error-rate ejection** keeps each window. Same window shape: bucket for bucket; a new
//!   window size: the old window's counts become one slice of the new window, aging out together.
//! * **Slow-call breakers**, as Sentinel reloads its rules: an endpoint whose breaker follows an
//!   unchanged rule keeps it, open or closed, with its counts and its callbacks; a changed rule
//!   starts a fresh, closed breaker. A probe in flight answers to the old breaker, so a half-open
//!   breaker is taken over as open and due.
//! * **Weights** keep each endpoint's counts since the last evaluation, its weight and whether it
//!   is degraded; the next evaluation judges them by the new rules.
//! * **Envoy, gRPC and linkerd detectors** keep streaks, interval counts, ejection multipliers
//!   and their counters (`DetectorStats`); standing detections are judged anew.
//! * **Intervals** (fleet evaluations, detector ticks): unchanged, the next evaluation stays
//!   when it was; changed, it comes one new interval after the change.
//!
//! # 13. Hosts shared by services (HSF's ipDimension)
//!
//! Layers given one [`HostRegistry`](crate::hosts::HostRegistry)
//! ([`share_hosts`](crate::OutlierDetectionLayer::share_hosts); HSF's `ipDimension: true`) share
//! their hosts, a key's host found by a [`HostOf`](crate::hosts::HostOf). An endpoint a layer
//! ejects, by any policy, holds its host out until that layer re-admits it (on trial, or after a
//! probe) or the upstream removes it. Every other sharing layer then ejects its endpoints on that
//! host — within its own budget and never its last endpoint (if refused, it is tried again when
//! there is room) — and re-admits them on trial once no layer holds the host out. Such an
//! endpoint has no recovery check of its own. A layer that does not share is unaffected, and an
//! adaptor that is dropped releases what it held out.
//!
//! A policy that judges by host ([`OutlierPolicy::judges_by_host`](crate::policy::OutlierPolicy::judges_by_host):
//! error-rate ejection with HSF's `ipDimension: true`) keeps, in layers that share hosts, one
//! state per host instead of one per endpoint: every endpoint on the host, in every sharing
//! layer running the same rules (the policy as it prints, configuration included), records into
//! it and is judged by it, so a host is judged once, on all its calls. New rules move each
//! endpoint to the host state of the new rules (the first endpoint of a host to move brings its
//! history); layers under different rules, or the same rules in another slot, keep different
//! windows. A re-admission does not clear the host's window (one service's trial, operator
//! release or dry run is no reason to forget what the others saw): its calls age out of it. A
//! host judged this way may have been judged on another service's calls alone, so, as when it
//! follows another service's host ejection, it never takes the layer's last endpoint, whatever
//! the layer does when all are out. An endpoint is judged when a call of its own is recorded or
//! the layer reconsiders it: another endpoint on a host whose window crossed the threshold in a
//! layer that could not eject (its budget, dry run) stays in until then. Inside a
//! `ComposedPolicy` the member's `ipDimension` is not applied (the composition's state is the
//! endpoint's).
//!
//! # 14. Operators above the rules
//!
//! Through the [`RulesHandle`](crate::RulesHandle), applied by every adaptor on its next poll:
//! * **Dry run**, layer-wide or per policy: the policies judge and every decision about an
//!   ejection is made as it would be — the budget and the last-endpoint rule counting what dry
//!   run holds out, recovery checks, trials, probes, re-admissions — and reported as
//!   [`Event::DryRun`](crate::events::Event::DryRun) and
//!   [`EndpointSnapshot::would_be`](crate::EndpointSnapshot), with no endpoint leaving the
//!   balancer's set. Enforcing policies are asked first; a dry-run policy neither keeps one from
//!   ejecting nor fails a real trial. On: endpoints ejected before come back into the set. Off:
//!   what dry run held out is forgotten with those endpoints' histories.
//! * **Overrides** by key: forced out (no recovery check; counted in the budget, never refused
//!   by it, never the last endpoint the balancer can pick), forced in (back at once, exempt from
//!   ejection: a policy's verdict is refused as `ForcedIn`, a host held out elsewhere does not
//!   take it out), released; and back-off resets. They hold through new rules, and an override
//!   of a key not yet discovered applies when it appears.
//!
//! # 15. Invariants
//!
//! Every change keeps these, and the tests check them:
//! 1. While the upstream holds endpoints, at least one is available (rule 3; under
//!    `WhenAllOut::KeepLast`, and always when only pushback, health, a host held out or an
//!    operator's overrides would take the last one): in the balancer's set and ready. An
//!    endpoint whose service failed `poll_ready` is held in the set but reports itself not
//!    ready, asks its service again after a back-off (100 ms doubling to 30 s), and is shown
//!    `Unready`; it does not count as one to fall back on, and if no endpoint is left to
//!    pick an ejected one comes back on trial.
//! 2. The endpoints out never exceed the budget, all policies together (rule 3).
//! 3. No real request reaches an ejected endpoint; only probes do.
//! 4. Nothing busy-polls: `Pending` always means a waker or timer is registered, and the adaptor
//!    never wakes its own task to be polled again for nothing. (Abandoning a probe wakes it once,
//!    as the abandoned probe finishes; the test harness checks every poll for a second one.)
//! 5. Recording an outcome takes no lock and allocates nothing. (A handle makes its lane, where
//!    its calls in flight are counted, once: at its first call or its first clone, or at its
//!    second call for a clone; that takes one allocation and one lock.)
//! 6. The upstream is authoritative (rule 8).
//! 7. Time comes from the layer's [`Clock`](crate::policy::Clock) (tokio's when paused, so tests are
//!    deterministic); deadlines from tokio's timer.
//! 8. Bad configuration is a typed error naming the field, the value and the allowed range; no
//!    input, configuration or response makes the library panic.
//! 9. A readiness error never ejects, and never reaches the balancer (tower's p2c would drop the
//!    endpoint for good, out of step with the layer).
//! 10. User code that panics — a probe, an `on_event` callback, a classifier, a breaker's state
//!     observer — is contained and logged: a panicking probe is a failed check, a panicking
//!     classifier leaves its call unrecorded; no user code runs in a destructor during an unwind.
//!
