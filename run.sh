#!/usr/bin/env bash
echo "run.sh: the fleet arrives with issue 3; meanwhile try: go run ./cmd/resource-exercise \"\$(mktemp -u)\"" >&2
exit 1
