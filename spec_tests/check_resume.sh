#!/bin/bash
# Checkpoints of examples/train_gpt (docs/checkpoints.md), run by ctest:
#  1. 8 ranks (pp 2 x tp 2 x dp 2) save every 3 steps; resumed from step 3
#     at tp 4 on 4 ranks and on one process, steps 3-5 give the 8-rank
#     run's losses (float32 at another layout: within 1e-4 relative); the
#     one process saves step 6 under ./checkpoints, the default place;
#  2. a rank killed at step 5 of a 4-rank run that saves every 2 steps: the
#     job ends within 30 s, non-zero; relaunched, it resumes from step 4 and
#     steps 4-5 give the uninterrupted run's losses, digit for digit;
#  3. a rank killed in the middle of the save of step 4: step-2 is the
#     latest checkpoint and step-4 is not one; relaunched, it resumes from
#     step 2, saves step 4 again, and steps 2-5 are the uninterrupted run's.
#  4. resumed from step 2 while step-4 exists: the save of step 4 takes the
#     next free name (step-4-r2) and step-4 stays as it was.
# usage: check_resume.sh MPIEXEC TRAIN_GPT WORKDIR
set -u
mpiexec=$1
gpt=$2
work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
export OMP_NUM_THREADS=1 PARTITA_DEADLINE=5 PARTITA_WAIT_TIMEOUT=55

fail() {
  echo "check_resume: FAILED: $*"
  exit 1
}
run() {  # LOG COMMAND...: the command under a timeout, its output in LOG
  local log=$1
  shift
  timeout 120 "$@" > "$log" 2>&1
}
losses() {  # LOG [FIRST]: "step loss" lines from step FIRST on
  grep -E '^step [0-9]+: loss' "$1" | sed -E 's/^step ([0-9]+): loss (.*)$/\1 \2/' | awk -v f="${2:-0}" '$1 >= f'
}
same() {  # A B FIRST: the losses from step FIRST on, digit for digit
  [ -n "$(losses "$1" "$3")" ] && [ "$(losses "$1" "$3")" = "$(losses "$2" "$3")" ] ||
    fail "$2's losses from step $3 are not $1's: $(losses "$2" "$3" | tr '\n' ' ') against $(losses "$1" "$3" | tr '\n' ' ')"
}
close() {  # A B FIRST: the same steps, within 1e-4 relative
  local a b
  a=$(losses "$1" "$3")
  b=$(losses "$2" "$3")
  [ -n "$b" ] && [ "$(echo "$a" | wc -l)" = "$(echo "$b" | wc -l)" ] || fail "$2 ran other steps than $1: $b"
  paste <(echo "$a") <(echo "$b") | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-4 * $2) bad = 1 }
    END { exit bad }' || fail "$2's losses from step $3 differ from $1's: $(echo "$b" | tr '\n' ' ') against $(echo "$a" | tr '\n' ' ')"
}

# 1. Another layout and another world size.
run a.log "$mpiexec" -n 8 "$gpt" --steps 6 --checkpoint-every 3 --checkpoint-dir a || fail "the 8-rank run: $(tail -3 a.log)"
[ -f a/step-3/model.safetensors ] && [ "$(cat a/latest)" = step-6 ] || fail "the 8-rank run did not leave step-3 and step-6"
PARTITA_SMP_CONFIG='{"partitions": 1, "tensor_parallel_degree": 4}' \
  run b.log "$mpiexec" -n 4 "$gpt" --steps 6 --resume a/step-3 || fail "tp 4 from step 3: $(tail -3 b.log)"
grep -q "resumed from a/step-3 (saved at pp 2 x tp 2 x dp 2) at step 3" b.log || fail "b.log: $(head -3 b.log)"
close a.log b.log 3
run c.log "$gpt" --steps 6 --resume a/step-3 --checkpoint-every 3 || fail "one process from step 3: $(tail -3 c.log)"
close a.log c.log 3
# Without --checkpoint-dir, checkpoints go under ./checkpoints.
[ -f checkpoints/step-6/manifest.json ] && [ "$(cat checkpoints/latest)" = step-6 ] && [ ! -e checkpoints/step-3 ] ||
  fail "the one-process run did not save step-6 under ./checkpoints: $(ls -R checkpoints 2>&1 | tr '\n' ' ')"
echo "check_resume: resumed at tp 4 on 4 ranks and on one process, the losses of the 8-rank run"

# The uninterrupted 4-rank run (pp 2 x tp 2).
run u.log "$mpiexec" -n 4 "$gpt" --steps 6 || fail "the 4-rank run: $(tail -3 u.log)"

# 2. A rank lost in the middle of training.
t0=$(date +%s)
run k.log "$mpiexec" -n 4 "$gpt" --steps 6 --checkpoint-every 2 --checkpoint-dir k --die-at-step 5 &&
  fail "the run whose rank was killed exited 0"
took=$(($(date +%s) - t0))
[ "$took" -le 30 ] || fail "the job took $took s to end after a rank was killed"
[ "$(cat k/latest)" = step-4 ] || fail "after the kill, latest is $(cat k/latest)"
run k2.log "$mpiexec" -n 4 "$gpt" --steps 6 --resume k || fail "the relaunch: $(tail -3 k2.log)"
grep -q "at step 4" k2.log || fail "the relaunch did not resume at step 4: $(head -2 k2.log)"
same u.log k2.log 4
echo "check_resume: a rank killed at step 5 (the job ended in $took s); resumed from step 4, the uninterrupted losses"
# Resumed from an older checkpoint than the newest (step-2 while step-4
# exists): the save of step 4 takes the next free name, step-4 stays.
before=$(md5sum k/step-4/model.safetensors)
run k3.log "$mpiexec" -n 4 "$gpt" --steps 6 --checkpoint-every 2 --checkpoint-dir k --resume k/step-2 ||
  fail "the relaunch from step-2 while step-4 exists: $(tail -3 k3.log)"
[ -f k/step-4-r2/manifest.json ] && [ "$(md5sum k/step-4/model.safetensors)" = "$before" ] && [ "$(cat k/latest)" = step-6 ] ||
  fail "the relaunch from step-2 left $(ls k | tr '\n' ' '), latest $(cat k/latest)"
same u.log k3.log 2
echo "check_resume: resumed from step 2 while step-4 existed; saved step-4-r2, the uninterrupted losses"

# 3. A rank lost in the middle of a save.
PARTITA_CHECKPOINT_KILL=1:step-4 run s.log "$mpiexec" -n 4 "$gpt" --steps 6 --checkpoint-every 2 --checkpoint-dir s &&
  fail "the run killed during a save exited 0"
partials() { ls -d s/step-4.partial-* 2>/dev/null | wc -l; }
[ "$(cat s/latest)" = step-2 ] && [ "$(partials)" = 1 ] && [ ! -e s/step-4 ] ||
  fail "after a kill during the save of step 4: latest $(cat s/latest), $(ls s | tr '\n' ' ')"
run s2.log "$mpiexec" -n 4 "$gpt" --steps 6 --checkpoint-every 2 --checkpoint-dir s --resume s ||
  fail "the relaunch: $(tail -3 s2.log)"
grep -q "at step 2" s2.log || fail "the relaunch did not resume at step 2: $(head -2 s2.log)"
[ -f s/step-4/manifest.json ] && [ "$(partials)" = 0 ] || fail "step-4 was not saved again: $(ls s | tr '\n' ' ')"
same u.log s2.log 2
echo "check_resume: a rank killed while saving step 4; step-2 stayed the latest, resumed from it, the uninterrupted losses"
echo "check_resume: PASSED"
