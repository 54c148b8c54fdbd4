"""Issue 50: a turn notice's link no longer carries the visitor's identity. The notices kept before it lose
the identity their link carried (signed, in clear): their e-mails link to the waiting page alone."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def links_without_identity(apps, schema_editor):
    TurnNotice = apps.get_model("queueing", "TurnNotice")
    for notice in TurnNotice.objects.filter(link__contains="?"):
        notice.link = notice.link.split("?", 1)[0]
        notice.save(update_fields=["link"])


class Migration(migrations.Migration):
    dependencies = [
        ("queueing", "0019_queue_time_zone"),
    ]

    operations = [
        migrations.RunPython(links_without_identity, migrations.RunPython.noop),
        migrations.AddField(
            model_name="turnnotice",
            name="sealed",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.CreateModel(
            name="PlaceLink",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("ticket_id", models.CharField(max_length=100)),
                ("epoch", models.PositiveIntegerField()),
                ("token_hash", models.CharField(max_length=64, unique=True)),
                ("sealed", models.TextField()),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("expires_at", models.DateTimeField()),
                ("used_at", models.DateTimeField(blank=True, null=True)),
                (
                    "queue",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="place_links", to="queueing.queue"
                    ),
                ),
            ],
            options={
                "ordering": ("created_at",),
            },
        ),
    ]
