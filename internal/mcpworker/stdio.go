package mcpworker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxStdioLine bounds one message read over stdio; a longer line is
// answered as an invalid request and skipped.
const MaxStdioLine = 4 << 20

// JSON-RPC 2.0's error codes for input that is not a request.
const (
	rpcParseError     = -32700
	rpcInvalidRequest = -32600
)

// StdioTransport is MCP's newline-delimited transport over in and out,
// with each line checked before the SDK reads it. The SDK's own reader
// ends the session on a line that is not a JSON-RPC message (and reads a
// truncated object on into the next line), and an agent's session ending
// gives its held job back; here such a line gets the error JSON-RPC
// defines for it (parse error, or invalid request), with its id when it
// has a usable one, and the session keeps serving.
func StdioTransport(in io.Reader, out io.Writer) mcp.Transport {
	w := &lockedWriter{w: out}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(forwardMessages(in, pw, w)) }()
	return &mcp.IOTransport{Reader: pr, Writer: w}
}

// lockedWriter makes each Write whole: the SDK's messages and the
// guard's errors share one stream.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return nil }

// forwardMessages copies each line of in that is a JSON-RPC 2.0 message
// to to, answering the others on answers.
func forwardMessages(in io.Reader, to io.Writer, answers io.Writer) error {
	r := bufio.NewReaderSize(in, 64<<10)
	for {
		line, tooLong, err := readLine(r)
		if len(bytes.TrimSpace(line)) > 0 || tooLong {
			if problem := checkMessage(line, tooLong); problem != nil {
				if _, werr := answers.Write(problem); werr != nil {
					return werr
				}
			} else if _, werr := to.Write(append(line, '\n')); werr != nil {
				return werr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// readLine reads one line without its end; past MaxStdioLine it reads on
// to the line's end, keeping nothing, and says so.
func readLine(r *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		if !tooLong {
			line = append(line, chunk...)
			if len(line) > MaxStdioLine {
				line, tooLong = nil, true
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), tooLong, err
	}
}

// checkMessage answers nil for a line that is a JSON-RPC 2.0 message the
// SDK can read, or the error response (a line of its own) for one that
// is not.
func checkMessage(line []byte, tooLong bool) []byte {
	if tooLong {
		return rpcError(nil, rpcInvalidRequest, "message over "+strconv.Itoa(MaxStdioLine)+" bytes")
	}
	if !json.Valid(line) {
		return rpcError(nil, rpcParseError, "parse error: not one JSON value per line")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil {
		return rpcError(nil, rpcInvalidRequest, "invalid request: a message is a JSON object (batches are not accepted)")
	}
	id, hasID := fields["id"]
	if hasID && !usableID(id) {
		return rpcError(nil, rpcInvalidRequest, "invalid request: id must be a string or an integer")
	}
	if !hasID {
		id = nil
	}
	if string(bytes.TrimSpace(fields["jsonrpc"])) != `"2.0"` {
		return rpcError(id, rpcInvalidRequest, `invalid request: jsonrpc must be "2.0"`)
	}
	method, isCall := fields["method"]
	if isCall {
		var name string
		if json.Unmarshal(method, &name) != nil {
			return rpcError(id, rpcInvalidRequest, "invalid request: method must be a string")
		}
		if params, ok := fields["params"]; ok && !bytes.HasPrefix(params, []byte("{")) && !bytes.HasPrefix(params, []byte("[")) {
			return rpcError(id, rpcInvalidRequest, "invalid request: params must be an object or an array")
		}
		return nil
	}
	_, result := fields["result"]
	_, failure := fields["error"]
	if !hasID || result == failure {
		return rpcError(id, rpcInvalidRequest, "invalid request: neither a call (method) nor a response (id and result or error)")
	}
	return nil
}

// usableID reports whether id is a string or an integer that fits 64
// bits, the ids the SDK keeps.
func usableID(id json.RawMessage) bool {
	id = bytes.TrimSpace(id)
	if len(id) > 0 && id[0] == '"' {
		var s string
		return json.Unmarshal(id, &s) == nil
	}
	_, err := strconv.ParseInt(string(id), 10, 64)
	return err == nil
}

// rpcError is a JSON-RPC error response line, to id (null when nil).
func rpcError(id json.RawMessage, code int, message string) []byte {
	if id == nil {
		id = json.RawMessage("null")
	}
	out, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, message}})
	return append(out, '\n')
}
