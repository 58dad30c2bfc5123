"""Chat: rendering conversations into a model's prompt text with its own Jinja chat template (template.py)."""

from redline.chat.template import ChatTemplate, normalize_messages, template_for

__all__ = ["ChatTemplate", "normalize_messages", "template_for"]
