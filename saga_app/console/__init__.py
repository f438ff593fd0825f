"""The operators' web console: sagas, the people's queue, dead letters, rejections and the
catalog in a browser, and the CLI's decisions as buttons, sent for the person signed in."""
