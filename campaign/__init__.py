"""The campaign: kb-mcp's built-in agent, one more client of the five tools.

It runs the KernelBlaster loop (profile, classify, suggest, write, verify, record, and a textual
gradient after each batch) on a folder of problems with an OpenAI-compatible LLM. It sits above
`tools/` and calls the tool functions the way any MCP client calls the tools; nothing below it
imports it.
"""
