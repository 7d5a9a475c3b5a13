"""``zeroloss.conf``: the settings' public names (declared in :mod:`zeroloss.core.settings`)."""

from .core.queue_settings import QUEUE_OPTIONS as QUEUE_OPTIONS
from .core.queue_settings import QueueSettings as QueueSettings
from .core.setting_values import DEFAULT_RETENTION as DEFAULT_RETENTION
from .core.setting_values import MAX_SECONDS as MAX_SECONDS
from .core.setting_values import SettingError as SettingError
from .core.settings import ZeroLossSettings as ZeroLossSettings
from .core.settings import get_settings as get_settings
from .core.settings import json_default as json_default
from .core.settings import parse_settings as parse_settings
from .core.settings_delivery import RetryBackoff as RetryBackoff
