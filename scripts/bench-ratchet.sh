#!/usr/bin/env bash
# Ratchet benchmark: ratchet steps/s and AES-256-GCM seal/open throughput (256 B, 2 KiB) of
# the Ratchet module, release build, against `openssl speed` measured in this same run.
# Prints one markdown section on stdout (scripts/bench.sh collects it); progress on stderr.
# Both sides count CPU time (openssl speed's default; ratchet-bench uses the thread CPU clock),
# so other load on the machine skews the ratios less. Finishes in well under a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
SWIFT=${SWIFT:-swift}
SECONDS_PER=${RATCHET_BENCH_SECONDS:-0.5}

echo "building ratchet-bench (release)" >&2
$SWIFT build -c release --product ratchet-bench >&2
bin=$($SWIFT build -c release --show-bin-path)/ratchet-bench

# openssl speed -mr prints "+F:<n>:<alg>:<bytes per second>" per block size.
openssl_rate() { # $1 = block bytes, rest = algorithm options
  local bytes=$1; shift
  openssl speed -mr -seconds 1 -bytes "$bytes" "$@" 2>/dev/null | awk -F: '/^\+F:/{print $4; exit}'
}
echo "openssl speed anchors" >&2
gcm256=$(openssl_rate 256 -evp aes-256-gcm)
gcm2048=$(openssl_rate 2048 -evp aes-256-gcm)
hmac64=$(openssl_rate 64 -hmac sha256)

echo "ratchet-bench" >&2
out=$("$bin" "$SECONDS_PER")
get() { printf '%s\n' "$out" | awk -F= -v k="$1" '$1==k{print $2}'; }

awk_fmt() { awk "BEGIN{printf \"$1\", $2}"; }
mbs() { awk_fmt "%.0f" "$1/1e6"; }
ratio() { awk_fmt "%.2f" "$1/$2"; }

steps=$(get ratchet_steps_per_sec)
hmac_ops=$(awk_fmt "%.0f" "$hmac64/64")      # HMAC-SHA256 operations/s on 64-byte messages
step_anchor=$(awk_fmt "%.0f" "$hmac_ops/2")   # a step is two HMAC-SHA256 blocks of output (64 bytes)

cat <<MD
## Ratchet (scripts/bench-ratchet.sh)

Release build of \`Sources/Ratchet\` (OpenSSL $(openssl version | awk '{print $2}') EVP_KDF HKDF, EVP AES-256-GCM),
measured by \`.build/release/ratchet-bench $SECONDS_PER\` against \`openssl speed -mr -seconds 1\`
run in the same session: \`-bytes 256 -evp aes-256-gcm\`, \`-bytes 2048 -evp aes-256-gcm\`,
\`-bytes 64 -hmac sha256\`. CPU time on both sides.

| measurement | Ratchet module | anchor (openssl speed) | ratio |
|---|---:|---:|---:|
| ratchet step (HKDF-SHA256 expand, 64 B out) | $(printf "%d" "$steps") steps/s | $(printf "%d" "$step_anchor") (HMAC-SHA256 64 B ops/s ÷ 2) | $(ratio "$steps" "$step_anchor") |
| seal 256 B (random nonce, combined box) | $(mbs "$(get seal_256_bytes_per_sec)") MB/s ($(printf "%d" "$(get seal_256_per_sec)") msg/s) | $(mbs "$gcm256") MB/s | $(ratio "$(get seal_256_bytes_per_sec)" "$gcm256") |
| seal 256 B, caller's nonce (no RNG; vectors only) | $(printf "%d" "$(get seal_fixed_nonce_256_per_sec)") msg/s | | |
| open 256 B | $(mbs "$(get open_256_bytes_per_sec)") MB/s ($(printf "%d" "$(get open_256_per_sec)") msg/s) | $(mbs "$gcm256") MB/s | $(ratio "$(get open_256_bytes_per_sec)" "$gcm256") |
| seal 2 KiB | $(mbs "$(get seal_2048_bytes_per_sec)") MB/s ($(printf "%d" "$(get seal_2048_per_sec)") msg/s) | $(mbs "$gcm2048") MB/s | $(ratio "$(get seal_2048_bytes_per_sec)" "$gcm2048") |
| open 2 KiB | $(mbs "$(get open_2048_bytes_per_sec)") MB/s ($(printf "%d" "$(get open_2048_per_sec)") msg/s) | $(mbs "$gcm2048") MB/s | $(ratio "$(get open_2048_bytes_per_sec)" "$gcm2048") |

Receiving ratchet, one 1,000-message gap then all 1,000 skipped keys used:
$(get receiver_gap1000_keys) keys in $(awk_fmt "%.2f" "$(get receiver_gap1000_seconds)*1000") ms CPU.

How to read it: \`openssl speed -evp\` encrypts a stream of blocks with one context and no tag,
so its figure is the cipher's ceiling. Each of our seals and opens is a whole message: a fresh
EVP context, a 12-byte nonce (seal: from RAND_bytes), the 16-byte tag, Swift buffers. A ratio
well below 1 at 256 B is that per-message cost; at 2 KiB it should shrink. The "caller's nonce"
row isolates the nonce: OpenSSL 3.0's RAND_bytes (CTR-DRBG) is most of a 256-byte seal. The step anchor is a
lower bound of the work in one step (two HMAC-SHA256 computations); the rest is EVP_KDF context
set-up, which OpenSSL 3.0 cannot duplicate (see docs/ratchet.md).
MD
