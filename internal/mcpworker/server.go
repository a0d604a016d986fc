package mcpworker

import (
	"context"
	"errors"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Version is fleet-mcp's, as MCP clients see it.
const Version = "1.0.0"

// PromptName is the prompt that describes the worker loop.
const PromptName = "fleet_worker"

// NewServer is the MCP server offering a's tools and the worker prompt.
func NewServer(a *Agent) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "fleet-mcp", Version: Version}, &mcp.ServerOptions{
		Instructions: "Fleet worker tools. Get the " + PromptName + " prompt for the loop: take_job, begin_work, write the section, publish_section (or report_failure).",
	})
	addTool(s, a, &mcp.Tool{Name: "take_job", Description: "Claim the next report section to write, admitted against the shared allowance with the claim. " +
		"Answers claimed with the job (document, section, instructions, claim and lease) and its admission, " +
		"denied when the allowance cannot pay for the section claimed (do not write it; call take_job again), or nothing_to_do when the queue is empty (stop), " +
		"waiting or paused (call again in a while). Refused while you hold a job whose claim still counts."},
		func(ctx context.Context, _ empty) (TakeOutput, error) { return a.Take(ctx) })
	addTool(s, a, &mcp.Tool{Name: "begin_work", Description: "Ask the host to admit the job you hold against the shared allowance, before writing anything (when take_job admitted it, its admission again). " +
		"allow: write the section. A denial is an error named denied, with the signed receipt: do not write the section; take the next job."},
		func(ctx context.Context, _ empty) (BeginOutput, error) { return a.Begin(ctx) })
	addTool(s, a, &mcp.Tool{Name: "read_document", Description: "Read the held job's document as it is now on the host: " +
		"its version, its generation, whether it is still assigned to you, and the published section if there is one."},
		func(ctx context.Context, _ empty) (DocumentOutput, error) { return a.Read(ctx) })
	addTool(s, a, &mcp.Tool{Name: "publish_section", Description: "Publish the section you wrote for the held, admitted job. " +
		"Give only the text (and token counts if you know them): fleet-mcp binds it to the job and chooses the operation key. " +
		"Errors: superseded (the document was reassigned), stale_claim, rejected, version_conflict; host_unreachable means " +
		"the answer was lost: call publish_section again and the same publication is sent again, never published twice."},
		func(ctx context.Context, in PublishInput) (PublishOutput, error) { return a.Publish(ctx, in) })
	addTool(s, a, &mcp.Tool{Name: "report_failure", Description: "Report that you could not write the held job's section: " +
		"the reason, whether another attempt could succeed, and token counts if you know them. The host retries it or fails it."},
		func(ctx context.Context, in FailInput) (FailOutput, error) { return a.Fail(ctx, in) })
	addTool(s, a, &mcp.Tool{Name: "status", Description: "What this worker holds: the job, whether it was admitted, its lease, " +
		"when fleet-mcp stops renewing it, and whether its claim ended (its renewal refused); a job cancelled or let go is no longer held, and a notice says so."},
		func(context.Context, empty) (StatusOutput, error) { return a.Status(), nil })
	s.AddPrompt(&mcp.Prompt{Name: PromptName, Title: "Work as a Fleet worker",
		Description: "The worker loop: take a job, begin it, write its section, publish it or report a failure; repeat until there is nothing to do."},
		func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Description: "The Fleet worker loop", Messages: []*mcp.PromptMessage{
				{Role: "user", Content: &mcp.TextContent{Text: promptText}}}}, nil
		})
	return s
}

// addTool adds a tool whose calls run one at a time. An error reaches the
// agent as a tool error ("code: what happened"), followed by any notices;
// a denial carries its structured answer too.
func addTool[In, Out any](s *mcp.Server, a *Agent, t *mcp.Tool, fn func(context.Context, In) (Out, error)) {
	mcp.AddTool(s, t, func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		a.calls.Lock()
		defer a.calls.Unlock()
		out, err := fn(ctx, in)
		if err == nil {
			return nil, out, nil
		}
		text := err.Error()
		if notices := a.takeNotices(); len(notices) > 0 {
			text += "\nnotices:\n- " + strings.Join(notices, "\n- ")
		}
		var te *ToolError
		if errors.As(err, &te) && te.Code == codeDenied {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}, out, nil
		}
		var zero Out
		return nil, zero, errors.New(text)
	})
}
