"""OpenAI-compatible HTTP serving of an `Engine` (`dsgraph serve`): request conversion, prompt rendering
and response construction are DeepSeek's `deepseek-recipe`; this package drives the engine."""
