#!/bin/bash
set -euo pipefail
python3 -c 'print(6 * 7)' > "$ANSWER_FILE"
